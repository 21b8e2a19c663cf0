"""Wall time to simulate one iteration of a 1,024-GPU plan with 128 micro-batches per pipeline.

Run: python benchmarks/bench_simulate.py Cluster: 128 nodes of 8×A100-80GB in 4 islands of 32 nodes
(1600 Gbit/s NICs, 3200 Gbit/s island links in a ring), LLaMA-2-70B, layout tp=8, pp=8, dp=16,
micro-batch 1, global batch 2048 → 128 micro-batches per pipeline: 32,768 forward/backward
operations and about 29,000 point-to-point flows per iteration.
"""

from __future__ import annotations

import time
from pathlib import Path

from hetopt.evaluate import evaluate
from hetopt.layout import expand_layout, parse_layout
from hetopt.sim.engine import Simulation
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.scenarios import BandwidthScenario
from hetopt.spec.schema import InstanceFile

ISLANDS = ["dc0", "dc1", "dc2", "dc3"]


def instance():
    data = {
        "name": "bench-1024",
        "model": {"preset": "llama2-70b"},
        "training": {"seq_len": 4096, "global_batch": 2048},
        "cluster": {
            "nodes": [
                {
                    "name": f"n{i}",
                    "count": 32,
                    "gpu": "A100-80GB",
                    "gpus_per_node": 8,
                    "island": isl,
                    "nic_gbps": 1600,
                }
                for i, isl in enumerate(ISLANDS)
            ],
            "network": {
                "links": [
                    {"a": a, "b": b, "gbps": 3200, "latency_us": 5}
                    for a, b in zip(ISLANDS, ISLANDS[1:] + ISLANDS[:1], strict=True)
                ]
            },
        },
    }
    return instance_from_spec(
        validate_document(data, "bench", InstanceFile, "instance"), "bench", Path(".")
    )


def main() -> None:
    inst = instance()
    plan = expand_layout(inst, parse_layout("tp=8,pp=8,dp=16,mb=1,recompute=selective"))
    start = time.perf_counter()
    sim = Simulation(inst, plan)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    result = sim.run(BandwidthScenario("stable", 1.0, ()), iterations=1)
    wall = time.perf_counter() - start
    ops = sum(p.replicas * len(p.stages) * p.micro_batches * 2 for p in plan.pipelines)
    analytic = evaluate(inst, plan).iteration_time_s
    print(
        f"{inst.cluster.total_gpus} GPUs, {ops:,} compute operations, {len(sim.transfers)} "
        "distinct point-to-point routes"
    )
    print(
        f"  setup {setup:.2f} s, one iteration simulated in {wall:.2f} s wall "
        f"({ops / wall:,.0f} operations/s)"
    )
    print(
        f"  simulated iteration {result.iteration_times_s[0]:.2f} s vs analytic {analytic:.2f} "
        f"s ({result.iteration_times_s[0] / analytic - 1:+.1%})"
    )


if __name__ == "__main__":
    main()

"""Evaluations per second of the analytic cost model on a 64-GPU plan, in one process.

Run: python benchmarks/bench_evaluate.py [--seconds S] Two figures: a fresh plan each call (layout
expansion + placement + features + pricing, what a sweep of distinct layouts pays), and re-pricing
features already built (what a search pays when it re-prices a skeleton under other weights or
scenarios).
"""

from __future__ import annotations

import argparse
import time

import yaml

from hetopt.cost.profiles import Profiles
from hetopt.evaluate import evaluate, plan_features, price
from hetopt.layout import expand_layout, parse_layout
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

INSTANCE = """
name: bench-64
model: {preset: llama-13b}
training: {seq_len: 2048, global_batch: 512}
cluster:
  nodes:
    - {name: a100, count: 4, gpu: A100-80GB, gpus_per_node: 8, island: rack0, nic_gbps: 1600}
    - {name: v100, count: 4, gpu: V100-32GB, gpus_per_node: 8, island: rack1, nic_gbps: 400}
  network: {links: [{a: rack0, b: rack1, gbps: 400, latency_us: 10}]}
"""
LAYOUTS = [
    "tp=2,pp=4,dp=8,mb=1",
    "tp=4,pp=2,dp=8,mb=2",
    "tp=8,pp=4,dp=2,mb=1,recompute=selective",
    "tp=1,pp=8,dp=8,mb=1,recompute=full",
    "tp=2,pp=8,dp=4,mb=2,vp=5",
]


def rate(fn, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(n)
        n += 1
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    inst = instance_from_spec(
        validate_document(yaml.safe_load(INSTANCE), "bench", InstanceFile, "instance"),
        "bench",
        __import__("pathlib").Path("."),
    )
    profiles = Profiles()
    plans = [expand_layout(inst, parse_layout(t)) for t in LAYOUTS]
    feats = [plan_features(inst, p) for p in plans]

    def full(n: int) -> None:
        evaluate(inst, expand_layout(inst, parse_layout(LAYOUTS[n % len(LAYOUTS)])), profiles)

    def reprice(n: int) -> None:
        k = n % len(plans)
        price(inst, plans[k], feats[k], profiles)

    full(0)
    print(f"64-GPU plans ({inst.cluster.total_gpus} GPUs, {len(LAYOUTS)} layouts in turn)")
    print(f"  layout → plan → evaluate : {rate(full, args.seconds):8.0f} evaluations/s")
    print(f"  re-price built features  : {rate(reprice, args.seconds):8.0f} evaluations/s")


if __name__ == "__main__":
    main()

"""Solve time and gap of the exact planner per instance and backend.

Run: python benchmarks/bench_solve.py [INSTANCE ...] [--backends highs cbc cpsat] [--time-limit S]
Default instances: the bundled demo, the WAN-flapping pair of data centres and the 256, 1,024 and 4,096-GPU
scale instances. Aims (issue 5): proven optimal within 10 s at 1,024 GPUs and within 60 s at 4,096.
"""

from __future__ import annotations

import argparse

from hetopt.search.orchestrate import solve_exact
from hetopt.spec.instance import load_instance

DEFAULT = ["demo-a100-v100-llama7b", "wan-flapping-a100-v100", "scale-256-three-types", "scale-1024-four-islands",
           "scale-4096-four-types"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("instances", nargs="*", default=DEFAULT)
    parser.add_argument("--backends", nargs="+", default=["highs", "cbc", "cpsat"])
    parser.add_argument("--time-limit", type=float, default=120.0)
    args = parser.parse_args()
    print(f"{'instance':<28}{'GPUs':>6}{'backend':>8}{'status':>9}{'iteration s':>13}{'gap':>8}{'solve s':>9}"
          f"{'families':>10}{'skeletons':>11}{'solved':>8}")
    for name in args.instances:
        inst = load_instance(name)
        for backend in args.backends:
            r = solve_exact(inst, backend=backend, time_limit_s=args.time_limit)
            print(f"{inst.name:<28}{inst.cluster.total_gpus:>6}{backend:>8}{r.status.value:>9}"
                  f"{r.objective_s:>13.4f}{r.gap:>8.1%}{r.solve_time_s:>9.2f}{r.stats.families:>10,}"
                  f"{r.stats.enumerated:>11,}{r.stats.solved:>8}", flush=True)


if __name__ == "__main__":
    main()

"""How fast `hetopt replan` answers a neighbourhood change (issue 15: ≤ 1 s at 1,024 GPUs on 2
cores).

Run: python benchmarks/bench_replan.py [INSTANCE] [--time-limit S] [--factor F] [--dwell S] Solves
INSTANCE (default benchmarks/instances/scale-1024-two-regions.yaml, whose pipelines cross its one
link; scale-1024-four-islands is the other 1,024-GPU instance) once for its running plan, then cuts
each island link in turn to 1/F of its bandwidth (default 8) and times `replan` — the running plan
priced on the new network, its templates re-split exactly in each placement order, the migration
priced — without the full search, for a cut expected to last --dwell seconds (default 3,600). Prints
one row per link: seconds, decision, the running and the best plan's iteration times, the state
moved and its time, the break-even.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hetopt.planners import solve_ilp
from hetopt.replan.decide import replan
from hetopt.search.types import SearchRequest
from hetopt.spec.instance import load_instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "instance",
        nargs="?",
        default=str(Path(__file__).parent / "instances" / "scale-1024-two-regions.yaml"),
    )
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for the first solve"
    )
    parser.add_argument("--factor", type=float, default=8.0, help="each link cut to 1/factor")
    parser.add_argument(
        "--dwell", type=float, default=3600.0, help="seconds each cut is expected to last"
    )
    args = parser.parse_args()
    inst = load_instance(args.instance)
    solved = solve_ilp(SearchRequest(inst, time_limit_s=args.time_limit))
    plan = solved.plan
    print(
        f"{inst.name}: running plan {solved.objective_s:.4f} s per iteration "
        f"({solved.status.value}) on the nominal network"
    )
    # caches and imports warm, as in a long-running service
    replan(inst, plan, bandwidth={}, dwell_s=60.0)
    print(
        f"{'link':24s} {'replan s':>9s} {'decision':>8s} {'running s':>10s} {'best s':>9s} "
        f"{'moved GB':>9s} {'migration s':>11s} {'break-even s':>12s}"
    )
    for lk in inst.spec.cluster.network.links:
        start = time.perf_counter()  # the first answer on this network: nothing of it cached
        r = replan(inst, plan, bandwidth={(lk.a, lk.b): lk.gbps / args.factor}, dwell_s=args.dwell)
        took = time.perf_counter() - start
        print(
            f"{lk.a + '-' + lk.b:24s} {took:9.3f} {r.decision:>8s} {r.current_s:10.4f} "
            f"{r.new_s:9.4f} {r.migration.total_bytes / 1e9:9.2f} {r.migration.time_s:11.3f} "
            f"{r.break_even_s:12.1f}"
        )


if __name__ == "__main__":
    main()

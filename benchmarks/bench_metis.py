"""metis-like against the proven optimum of hetopt's space, on every bundled instance (issue 12).

For each instance: the metis-like plan (Metis's shapes: stages that mix GPU types, per-stage DP
width), its evaluator time and its simulated time at the instance's first scenario, and the proven
optimum of the instance's search space (`hetopt solve`, its `search:` section kept), evaluator and
simulator alike, and whether the metis-like plan is a point of that space (`outside_space`: "in
space", else why not). Since stages with shards are searched (search.shards) every metis-like plan
is a point of the space, so the optimum is never slower. Run: python benchmarks/bench_metis.py
[--time-limit S] [INSTANCE ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hetopt.baselines.metis import metis_like
from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.roots import outside_space
from hetopt.search.types import SearchOptions, SearchRequest
from hetopt.sim.engine import Simulation
from hetopt.spec.instance import load_instance

REPO = Path(__file__).resolve().parents[1]


def shape(plan) -> str:
    pipe = plan.pipelines[0]
    stages = []
    for st in pipe.stages:
        ranks = "+".join(f"{sh.ranks}×{sh.gpu}·{sh.sequences}" for sh in st.shards) or st.gpu
        stages.append(f"{ranks}/tp{st.tp}")
    return f"b={plan.micro_batch} R={pipe.replicas} m={pipe.micro_batches}: " + " → ".join(stages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instances", nargs="*")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    paths = [Path(p) for p in args.instances] or sorted((REPO / "instances").glob("*.yaml"))
    print(
        f"{'instance':34} {'metis s':>9} {'sim':>9} {'optimum s':>10} {'sim':>9} "
        f"{'metis/opt':>9}  metis-like plan"
    )
    for path in paths:
        inst = load_instance(path)
        scenario = inst.scenarios(100)[0]
        start = time.perf_counter()
        metis = metis_like(inst, args.time_limit)
        metis_s = time.perf_counter() - start
        best = solve_ilp(SearchRequest(inst, time_limit_s=args.time_limit))
        rows = []
        for plan in (metis.plan, best.plan):
            if plan is None:
                rows.append((float("nan"), float("nan")))
                continue
            rows.append(
                (
                    evaluate(inst, plan).iteration_time_s,
                    Simulation(inst, plan).run(scenario).iteration_times_s[0],
                )
            )
        (m, m_sim), (o, o_sim) = rows
        label = shape(metis.plan) if metis.plan is not None else "no plan"
        why = (
            outside_space(inst, metis.plan, SearchOptions.from_instance(inst))
            if metis.plan is not None
            else []
        )
        member = "in space" if not why else "outside: " + "; ".join(why)
        print(
            f"{inst.name:34} {m:9.4f} {m_sim:9.4f} {o:10.4f} {o_sim:9.4f} {m / o:9.3f}  {label} "
            f"({metis_s:.1f} s; optimum {best.status.value}; {member})",
            flush=True,
        )


if __name__ == "__main__":
    main()

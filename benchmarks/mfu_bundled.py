"""MFU of the plan `hetopt solve` returns on every bundled instance, against what practitioners see.

Run: python benchmarks/mfu_bundled.py [INSTANCE ...] [--time-limit S] [--backend highs]

Public runs of 7B–70B models on A100/H100 report MFU of roughly 35–60% (MosaicML llm-foundry's
tables, torchtitan's, Korthikanti et al. 2022): a plan predicted above 65% is flagged for a look.
MFU counts model FLOPs only (6·params·tokens plus attention, docs/cli-output.md) over the peak of
the GPUs the plan uses.
"""

from __future__ import annotations

import argparse

from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.types import SearchRequest
from hetopt.spec.instance import bundled_instances, load_instance

HIGH_MFU = 0.65


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("instances", nargs="*")
    parser.add_argument("--backend", default="highs")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    print(
        f"{'instance':<32}{'GPUs':>6}{'status':>9}{'iteration s':>13}{'TFLOP/s/GPU':>13}{'MFU':>7}"
        f"{'compute':>9}{'bubble':>8}{'comm':>7}"
    )
    for name in args.instances or sorted(bundled_instances()):
        inst = load_instance(name)
        r = solve_ilp(SearchRequest(inst, backend=args.backend, time_limit_s=args.time_limit))
        if r.plan is None:
            print(
                f"{inst.name:<32}{inst.cluster.total_gpus:>6}{r.status.value:>9}  no plan",
                flush=True,
            )
            continue
        ev = evaluate(inst, r.plan)
        b = ev.breakdown
        total = ev.iteration_time_s
        comm = b["tp_comm"] + b["pp_comm"] + b["dp_comm"]
        flag = "  ← above 65%" if ev.mfu > HIGH_MFU else ""
        print(
            f"{inst.name:<32}{inst.cluster.total_gpus:>6}{r.status.value:>9}{total:>13.3f}"
            f"{ev.tflops_per_gpu:>13.1f}{ev.mfu:>7.1%}{b['compute'] / total:>9.0%}"
            f"{b['bubble'] / total:>8.0%}{comm / total:>7.0%}{flag}",
            flush=True,
        )


if __name__ == "__main__":
    main()

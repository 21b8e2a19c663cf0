"""Every small instance (tests/small), every backend: the exact search under a budget of a share of
the fastest plan's dollars per hour, and under the cost objective, against exhaustive enumeration.

    python benchmarks/check_dollars_small.py [--share 0.6] [--out benchmarks/check_dollars_small.md]

The test suite checks a few of them (tests/test_budget.py); this checks them all, by hand: about a
minute per instance on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from hetopt.baselines.exhaustive import exhaustive
from hetopt.cheapest import cheapest_per_token
from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.types import SearchOptions, SearchRequest
from hetopt.spec.instance import load_instance

HERE = Path(__file__).resolve().parent
SMALL = HERE.parent / "tests" / "small"
BACKENDS = [("split-milp", "cbc"), ("split-milp", "highs"), ("split-cpsat", "cpsat")]
REL = {"cbc": 1e-9, "highs": 1e-9, "cpsat": 1e-4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--share", type=float, default=0.6)
    ap.add_argument("--out", type=Path, default=HERE / "check_dollars_small.md")
    ap.add_argument("--only", nargs="*", help="instance names (default: all)")
    args = ap.parse_args()
    lines = [
        f"# Budgets and the cost objective against exhaustive enumeration "
        f"({time.strftime('%Y-%m-%d')}, budget {args.share:.0%} of the fastest plan's $/h)",
        "",
        "| instance | budget $/h | enumerated s | optimum within it s | "
        + " | ".join(f"{b} budget / cost" for _, b in BACKENDS)
        + " | least $/Mtok |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---" for _ in BACKENDS) + " | ---: |",
    ]
    agree = total = 0
    for path in sorted(SMALL.glob("*.yaml")):
        if args.only and path.stem not in args.only:
            continue
        inst = load_instance(path)
        began = time.time()
        fastest = exhaustive(inst)
        if evaluate(inst, fastest.plan).usd_per_hour is None:
            lines.append(f"| {path.stem} | no prices (a custom GPU type without one) |")
            print(lines[-1], flush=True)
            continue
        cap = args.share * evaluate(inst, fastest.plan).usd_per_hour
        opts = dataclasses.replace(SearchOptions.from_instance(inst), max_usd_per_hour=cap)
        within = exhaustive(inst, opts)
        cheapest = exhaustive(inst, objective="cost")
        truth_cost = evaluate(inst, cheapest.plan).usd_per_million_tokens
        spent = time.time() - began
        cells = []
        for formulation, backend in BACKENDS:
            r = solve_ilp(
                SearchRequest(
                    inst, formulation=formulation, backend=backend, time_limit_s=120, options=opts
                )
            )
            ok_budget = (
                r.plan is None
                if within.plan is None
                else r.plan is not None
                and abs(r.objective_s - within.objective_s) <= REL[backend] * within.objective_s
            )
            c = cheapest_per_token(
                SearchRequest(inst, formulation=formulation, backend=backend, time_limit_s=300)
            )
            ok_cost = abs(c.usd_per_million_tokens - truth_cost) <= REL[backend] * truth_cost
            proven = c.result.status.value == "optimal" and r.status.value in (
                "optimal",
                "infeasible",
            )
            cells.append(
                f"{'✓' if ok_budget else '✗'} {r.status.value} / "
                f"{'✓' if ok_cost else '✗'} {c.result.status.value}"
            )
            agree += ok_budget and ok_cost and proven
            total += 1
        plan_s = within.objective_s if within.plan is not None else float("nan")
        lines.append(
            f"| {path.stem} | {cap:,.2f} | {spent:.1f} | {plan_s:.4f} | "
            + " | ".join(cells)
            + f" | {truth_cost:.5f} |"
        )
        print(lines[-1], flush=True)
    lines += ["", f"Agreeing and proven: {agree} of {total} (instance, backend) pairs."]
    args.out.write_text("\n".join(lines) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()

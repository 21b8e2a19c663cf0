"""Dollars on every bundled instance (issue 38): the time-optimal plan's $/h and $/Mtok, the plan
under a budget of a share of that $/h (default 60%), and (with --cost) the cost-optimal plan.

    python benchmarks/bench_dollars.py [--time-limit 60] [--share 0.6] [--cost] [--only NAME ...] \\
        [--out benchmarks/bench_dollars.md]

Each solve runs in a fresh process (`hetopt solve --json`), one at a time: the figures include wall
time. A hand-run benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def solve(name: str, limit_s: float, *extra: str) -> dict:
    began = time.time()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetopt",
            "solve",
            name,
            "--time-limit",
            str(limit_s),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    out = json.loads(r.stdout) if r.stdout.strip() else {"status": f"exit {r.returncode}"}
    out["wall_s"] = time.time() - began
    out["exit"] = r.returncode
    if r.returncode not in (0, 1):
        out["stderr"] = r.stderr.strip().splitlines()[-1:]
    return out


def row(name: str, what: str, r: dict) -> str:
    def num(key: str, fmt: str) -> str:
        v = r.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "—"

    reason = (r.get("reason") or "")[:90].replace("|", "/")
    return (
        f"| {name} | {what} | {r.get('status')} | {num('objective_s', '.4f')} | "
        f"{num('gap', '.2%')} | {num('usd_per_hour', ',.2f')} | "
        f"{num('usd_per_million_tokens', '.4f')} | {r['wall_s']:.1f} | {reason} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--share", type=float, default=0.6)
    ap.add_argument("--cost", action="store_true", help="also the cost objective")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--out", type=Path, default=HERE / "bench_dollars.md")
    args = ap.parse_args()
    listing = subprocess.run(
        [sys.executable, "-m", "hetopt", "instances", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    names = [i["name"] for i in json.loads(listing.stdout)["instances"]]
    if args.only:
        names = [n for n in names if n in args.only]
    lines = [
        f"# Dollars on the bundled instances ({time.strftime('%Y-%m-%d')}, "
        f"`--time-limit {args.time_limit:g}`, budget {args.share:.0%} of the fastest plan's $/h)",
        "",
        "| instance | run | status | iteration s | gap | $/h | $/Mtok | wall s | reason |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        fastest = solve(name, args.time_limit)
        lines.append(row(name, "time", fastest))
        print(lines[-1], flush=True)
        if fastest.get("usd_per_hour"):
            cap = args.share * fastest["usd_per_hour"]
            budget = solve(name, args.time_limit, "--max-usd-per-hour", f"{cap:.6f}")
            lines.append(row(name, f"≤ ${cap:,.2f}/h", budget))
            print(lines[-1], flush=True)
        if args.cost:
            cost = solve(name, args.time_limit, "--objective", "cost")
            lines.append(row(name, "cost", cost))
            print(lines[-1], flush=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

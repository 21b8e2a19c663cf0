"""Solve time and gap of the exact planner per instance and backend, with and without `search:`
narrowing.

Run: python benchmarks/bench_solve.py [INSTANCE ...] [--all] [--backends highs cbc cpsat]
[--time-limit S]
                                      [--narrowing on|off|both] [--executor process|ray] [--address
                                      A] [--pair-classes N]
Default instances: the bundled demo, the WAN-flapping pair of data centres and the 256, 1,024 and
4,096-GPU scale instances; --all: every bundled instance. --narrowing off drops the instance's
`search:` section (the default plan space: TP 1–8, micro-batch 1–8, every recompute mode, 16 stages,
4 classes, 2 templates). Aims (issues 5, 11, 12): every bundled instance proven optimal on 2 cores,
with and without its narrowing; without narrowing 4,096 GPUs of 4 types within 120 s, the same plan
and bound with --executor ray; the search's memory below 4 GiB at 8,192 GPUs
(benchmarks/instances/scale-8192-four-types.yaml, given by path). --pair-classes N sets
search.pair_classes on every instance run (two templates of up to N classes each). The two memory
columns are peak resident sets (getrusage): of this process (the search, its tree and its in-process
solves) and of the largest worker process; both are peaks since the script started, so run one
instance at a time for its own figure.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from hetopt.planners import solve_ilp
from hetopt.search.types import SearchRequest
from hetopt.spec.instance import instance_from_spec, load_instance, resolve_instance_path

DEFAULT = [
    "demo-a100-v100-llama7b",
    "wan-flapping-a100-v100",
    "scale-256-three-types",
    "scale-1024-four-islands",
    "scale-4096-four-types",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("instances", nargs="*", default=DEFAULT)
    parser.add_argument("--backends", nargs="+", default=["highs", "cbc", "cpsat"])
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--all", action="store_true", help="every bundled instance")
    parser.add_argument("--narrowing", choices=("on", "off", "both"), default="on")
    parser.add_argument(
        "--executor",
        choices=("process", "ray"),
        default="process",
        help="where skeletons are solved side by side (ray: optional extra [ray])",
    )
    parser.add_argument("--address", default=None, help="a Ray cluster (with --executor ray)")
    parser.add_argument(
        "--pair-classes",
        type=int,
        default=None,
        help="search.pair_classes for every instance (default: each instance's own)",
    )
    args = parser.parse_args()
    names = sorted(p.stem for p in BUNDLED.glob("*.yaml")) if args.all else args.instances
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.narrowing]
    print(
        f"{'instance':<28}{'search:':>8}{'GPUs':>6}{'backend':>8}{'status':>9}"
        f"{'iteration s':>13}{'gap':>8}{'solve s':>9}{'families':>10}{'skeletons':>11}"
        f"{'solved':>8}{'bound s':>12}{'MiB':>7}{'worker':>7}  plan"
    )
    for name in names:
        for narrowed in modes:
            inst = load_instance(name) if narrowed else unnarrowed(name)
            if args.pair_classes is not None:
                inst = with_search(
                    name, inst.spec.search.model_copy(update={"pair_classes": args.pair_classes})
                )
            for backend in args.backends:
                r = solve_ilp(
                    SearchRequest(
                        inst,
                        backend=backend,
                        time_limit_s=args.time_limit,
                        executor=args.executor,
                        address=args.address,
                    )
                )
                print(
                    f"{inst.name:<28}{'kept' if narrowed else 'off':>8}{inst.cluster.total_gpus:>6}"
                    f"{backend:>8}{r.status.value:>9}{r.objective_s:>13.4f}{r.gap:>8.1%}{r.solve_time_s:>9.2f}"
                    f"{r.stats.families:>10,}{r.stats.enumerated:>11,}{r.stats.solved:>8}{r.bound_s:>12.6f}"
                    f"{peak_mib(resource.RUSAGE_SELF):>7,}{peak_mib(resource.RUSAGE_CHILDREN):>7,} "
                    " "
                    f"{r.skeleton.describe() if r.skeleton else 'warm start'}",
                    flush=True,
                )


def peak_mib(who: int) -> int:
    """Peak resident set in MiB of this process (RUSAGE_SELF) or of its largest ended-or-waited
    child (RUSAGE_CHILDREN); Linux reports KiB."""
    return resource.getrusage(who).ru_maxrss // 1024


BUNDLED = Path(__file__).resolve().parents[1] / "instances"


def unnarrowed(name: str):
    """The bundled instance `name` without its `search:` section: the default plan space."""
    return with_search(name, type(load_instance(name).spec.search)())


def with_search(name: str, search):
    """The bundled instance `name` with `search` as its `search:` section."""
    spec = load_instance(name).spec.model_copy(update={"search": search})
    path = resolve_instance_path(name)
    return instance_from_spec(spec, str(path), path.parent, None, path)


if __name__ == "__main__":
    main()

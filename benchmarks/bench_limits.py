"""Wall time and peak memory of commands that used to run away (issue 13): each must end within its
time limit + 30 s and under 2 GiB.

    python benchmarks/bench_limits.py            # every case
    python benchmarks/bench_limits.py --quick    # the cases under a minute

Each command runs as a user would run it (`python -m hetopt ...`); the peak is the largest sum of
the resident memory of the command and its worker processes, sampled every 50 ms (psutil).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3


def _variant(name: str, path: Path, edit) -> Path:
    spec = yaml.safe_load(path.read_text())
    edit(spec)
    out = Path(tempfile.mkdtemp()) / f"{name}.yaml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def cases(quick: bool) -> list[tuple[str, list[str], float]]:
    """(what, hetopt arguments, time limit s)."""
    demo = REPO / "instances" / "demo-a100-v100-llama7b.yaml"
    trillion = _variant("trillion", demo, lambda s: s["training"].update(global_batch=10**12))
    largest = _variant("batch-2-20", demo, lambda s: s["training"].update(global_batch=1 << 20))
    unnarrowed_1024 = _variant(
        "scale-1024-unnarrowed",
        REPO / "instances" / "scale-1024-four-islands.yaml",
        lambda s: s.pop("search"),
    )
    cloud = _variant(
        "cloud-mix-unnarrowed",
        REPO / "instances" / "cloud-mix-a10g-l4-t4-l40s.yaml",
        lambda s: s.update(search={"virtual_stages": [1, 2, 4]}),
    )
    out = [
        ("solve, global_batch 10^12", ["solve", str(trillion), "--time-limit", "60"], 60),
        (
            "solve, global_batch 2^20 (the largest allowed)",
            ["solve", str(largest), "--time-limit", "60"],
            60,
        ),
        (
            "solve cloud-mix with interleaving, --time-limit 8",
            ["solve", str(cloud), "--time-limit", "8"],
            8,
        ),
        (
            "solve scale-1024-four-islands, --time-limit 2",
            ["solve", "scale-1024-four-islands", "--time-limit", "2"],
            2,
        ),
        (
            "solve scale-1024 without its search: narrowing, --time-limit 10",
            ["solve", str(unnarrowed_1024), "--time-limit", "10"],
            10,
        ),
        (
            "simulate demo --iterations 100000 --time-limit 10",
            [
                "simulate",
                str(demo),
                "--layout",
                "tp=2,pp=2,dp=8",
                "--iterations",
                "100000",
                "--time-limit",
                "10",
            ],
            10,
        ),
    ]
    if not quick:
        scale_8192 = REPO / "benchmarks" / "instances" / "scale-8192-four-types.yaml"
        out.append(
            (
                "solve scale-8192, --time-limit 120",
                ["solve", str(scale_8192), "--time-limit", "120"],
                120,
            )
        )
        out.append(
            (
                "solve scale-8192 without its search: narrowing, --time-limit 60",
                [
                    "solve",
                    str(_variant("scale-8192-unnarrowed", scale_8192, lambda s: s.pop("search"))),
                    "--time-limit",
                    "60",
                ],
                60,
            )
        )
    return out


def measure(args: list[str]) -> tuple[int, float, float]:
    """(exit code, wall s, peak resident GiB of the command and its children)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetopt", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return proc.returncode, time.monotonic() - start, peak / GIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 8,192-GPU case")
    quick = parser.parse_args().quick
    print(f"{'case':<52} {'exit':>4} {'wall s':>7} {'limit+30':>8} {'peak GiB':>8}")
    for what, args, limit_s in cases(quick):
        code, wall_s, peak_gib = measure(args)
        ok = wall_s <= limit_s + 30 and peak_gib < 2
        print(
            f"{what:<52} {code:>4} {wall_s:>7.1f} {limit_s + 30:>8.0f} {peak_gib:>8.2f}"
            + ("" if ok else "  OVER")
        )


if __name__ == "__main__":
    main()

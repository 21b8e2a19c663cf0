from __future__ import annotations

import fcntl
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).resolve().parent / "bad_instances"
DEMO = REPO / "instances" / "demo-a100-v100-llama7b.yaml"
CALIBRATION = REPO / "data" / "calibration"
"""The public measurements the cost model is fitted on (data/calibration/README.md)."""


def run_hetopt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a fresh process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "hetopt", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=120,
    )


def run_in_process(args: list[str]) -> tuple[int, str]:
    """`hetopt ARGS` in this process, as `hetopt.cli.main` runs it: its exit code and what it wrote
    to stderr (no 0.7 s start-up per call, for the fuzz tests)."""
    import contextlib
    import io

    from hetopt.cli import main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    return code, stderr.getvalue()


def document_nodes(doc, path=()):
    """Every (key path, value) inside a parsed YAML/JSON document, the root included (the fuzz
    tests mutate them)."""
    yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from document_nodes(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from document_nodes(value, (*path, i))


@pytest.fixture
def hetopt():
    return run_hetopt


def once_per_run(name: str, compute, tmp_path_factory, worker_id: str):
    """`compute()` once for the whole test run: under pytest-xdist the first worker computes it and
    leaves it in the run's shared temporary directory under a lock, the others read it (the xdist
    recipe for a session fixture run once); without workers, computed here."""
    if worker_id == "master":
        return compute()
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = shared / f"{name}.pickle"
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value


def placed_optimum(inst, profiles, scenarios, sk, objective: str = "stable"):
    """A skeleton's placed program (hetopt.search.leaves.plan_problem) and its brute-force optimum
    (`best_fitting_split`); (None, inf) where it cannot be placed."""
    import math

    from hetopt.errors import InfeasibleError
    from hetopt.search.leaves import plan_problem

    try:
        problem = plan_problem(inst, sk, profiles, scenarios, objective)
    except InfeasibleError:
        return None, math.inf
    return problem, best_fitting_split(inst, problem, sk)


def best_fitting_split(inst, problem, sk) -> float:
    """The brute-force optimum of a skeleton's program: the least iteration time over every layer
    split (each template's layers in its stages, each stage ≥ 1) within the memory caps; inf where
    no split fits."""
    import itertools
    import math

    from hetopt.baselines.exhaustive import compositions

    caps = problem.base.max_layers()
    splits = (
        [n for t in split for n in t]
        for split in itertools.product(*(compositions(inst.model.layers, d) for d in sk.depths))
    )
    fitting = (s for s in splits if all(n <= c for n, c in zip(s, caps, strict=True)))
    return min((problem.iteration_time(s) for s in fitting), default=math.inf)

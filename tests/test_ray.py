"""Ray gives the same answers as the process pool: the exact search on a local Ray with 2 workers, a
bench sweep as Ray tasks, and `hetopt solve --executor ray --json`. Skipped where Ray is not
installed (the optional extra `pip install "hetopt[ray]"`, not part of `test`)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
from conftest import REPO

from hetopt.bench import run_bench
from hetopt.planners import solve_ilp
from hetopt.search.formulation import SolveStatus
from hetopt.search.types import SearchRequest
from hetopt.spec.instance import load_instance

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

SMALL = REPO / "tests" / "small" / "s4-three-types.yaml"


@pytest.fixture(scope="module")
def process_answer():
    # workers given: both executors start their 2 workers at once, so both see the same batches
    return solve_ilp(SearchRequest(load_instance(SMALL), backend="highs", workers=2))


def test_search_on_a_local_ray_with_2_workers_gives_the_process_pools_answer(process_answer):
    assert not ray.is_initialized()
    on_ray = solve_ilp(
        SearchRequest(load_instance(SMALL), backend="highs", workers=2, executor="ray")
    )
    assert not ray.is_initialized()  # the local Ray hetopt started is shut down again
    assert on_ray.executor == "ray" and process_answer.executor == "process"
    assert on_ray.status == process_answer.status == SolveStatus.OPTIMAL
    assert on_ray.objective_s == process_answer.objective_s
    assert on_ray.bound_s == process_answer.bound_s
    assert on_ray.plan.model_dump() == process_answer.plan.model_dump()
    assert on_ray.skeleton == process_answer.skeleton
    # the same batches in the same best-first order: the same leaves solved and pruned
    assert on_ray.stats.solved == process_answer.stats.solved
    assert dict(on_ray.stats.pruned) == dict(process_answer.stats.pruned)


def test_bench_sweep_as_ray_tasks_gives_the_serial_rows():
    inst = load_instance(SMALL)
    serial = run_bench([inst], ["ilp", "megatron"], iterations=1)
    finished = []
    on_ray = run_bench(
        [inst],
        ["ilp", "megatron"],
        iterations=1,
        executor="ray",
        progress=lambda i, p: finished.append(p),
    )
    assert not ray.is_initialized()
    assert sorted(finished) == ["ilp", "megatron"]

    def timeless(rows):  # the search time is the wall clock's, the rest is deterministic
        return [{k: v for k, v in asdict(r).items() if k != "search_time_s"} for r in rows]

    assert len(serial.rows) == 2 and timeless(on_ray.rows) == timeless(serial.rows)
    assert on_ray.samples == serial.samples and on_ray.dynamic == serial.dynamic


def test_cli_solve_on_ray_prints_one_json_object(process_answer):
    # workers start at once (PARALLEL_AFTER_S = 0), so the small instance really is solved on Ray
    code = (
        "import hetopt.search.orchestrate as o; o.PARALLEL_AFTER_S = 0.0; from hetopt.cli "
        f"import main; main(['solve', {str(SMALL)!r}, '--executor', 'ray', '--json'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # Ray writes nothing on stdout
    assert out["executor"] == "ray" and out["status"] == "optimal"
    assert out["objective_s"] == pytest.approx(process_answer.objective_s, rel=1e-12)
    assert out["bound_s"] == pytest.approx(process_answer.bound_s, rel=1e-12)

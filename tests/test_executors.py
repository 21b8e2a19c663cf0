"""`--executor` without Ray: the names, the errors (exit 2, with the fix), and Ray missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, run_hetopt

from hetopt.errors import InputError
from hetopt.executors import check_executor

SMALL = REPO / "tests" / "small" / "s4-three-types.yaml"


def test_executor_names():
    assert check_executor("process") == "process"
    # the documented name for this machine's worker processes (docs/cli-output.md)
    assert check_executor("local") == "process"
    with pytest.raises(InputError, match="did you mean 'ray'"):
        check_executor("rey")
    with pytest.raises(InputError, match="add --executor ray"):
        check_executor("process", "10.0.0.1:6379")


@pytest.mark.parametrize(
    "args, words",
    [
        (["solve", str(SMALL), "--executor", "dask"], "choose one of process, ray"),
        (["solve", str(SMALL), "--address", "10.0.0.1:6379"], "add --executor ray"),
        (
            [
                "bench",
                str(SMALL),
                "--planners",
                "megatron",
                "--executor",
                "threads",
                "--out",
                "unused-dir",
            ],
            "unknown executor",
        ),
    ],
)
def test_bad_executor_options_exit_2(args, words):
    result = run_hetopt(*args)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [["solve", str(SMALL)], ["bench", str(SMALL), "--planners", "megatron", "--out", "unused-dir"]],
)
def test_ray_not_installed_is_bad_input_naming_the_extra(command):
    # `import ray` fails as it would without the extra, whether or not Ray is installed here
    code = (
        "import sys; sys.modules['ray'] = None; from hetopt.cli import main; "
        f"main({[*command, '--executor', 'ray']!r})"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert 'pip install "hetopt[ray]"' in result.stderr and "Traceback" not in result.stderr
    assert not (REPO / "unused-dir").exists()

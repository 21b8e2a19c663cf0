from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).resolve().parent / "bad_instances"
DEMO = REPO / "instances" / "demo-a100-v100-llama7b.yaml"


def run_hetopt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a fresh process, as a user would."""
    return subprocess.run([sys.executable, "-m", "hetopt", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=120)


@pytest.fixture
def hetopt():
    return run_hetopt

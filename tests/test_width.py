"""Output that reads at 80 columns (issue 13): no line wider, no cell cut short with '…'."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import DEMO, REPO

COMMANDS = {
    "presets": ["presets"],
    "gpus": ["gpus"],
    "instances": ["instances"],
    "formulations": ["formulations"],
    "backends": ["backends"],
    "validate": ["validate", str(DEMO)],
    "solve": ["solve", str(DEMO)],
    "evaluate": ["evaluate", str(DEMO), "--layout", "tp=2,pp=2,dp=8"],
    "simulate": ["simulate", str(DEMO), "--layout", "tp=2,pp=2,dp=8"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_output_fits_80_columns_uncut(name):
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    result = subprocess.run([sys.executable, "-m", "hetopt", *COMMANDS[name]], capture_output=True, text=True,
                            cwd=REPO, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines
    wide = [line for line in lines if len(line.rstrip()) > 80]
    assert not wide, wide
    cut = [line for line in lines if "…" in line]
    assert not cut, cut

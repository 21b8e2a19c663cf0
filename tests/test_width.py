"""Output that reads at 80 columns (issue 13): no line wider, no cell cut short with '…'.

The commands run in one process started with COLUMNS=80 (rich reads the width when the console is
made), each through `hetopt.cli.main` as the command line runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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

RUN_EACH = """
import contextlib, io, json, sys
from hetopt.cli import main
outputs = {}
for name, args in json.loads(sys.argv[1]).items():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            main(args)
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
    outputs[name] = [code, text.getvalue()]
print(json.dumps(outputs))
"""


def test_every_command_fits_80_columns_uncut():
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-c", RUN_EACH, json.dumps(COMMANDS)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    for name, (code, text) in json.loads(result.stdout.splitlines()[-1]).items():
        assert code == 0, (name, result.stderr)
        lines = text.splitlines()
        assert lines, name
        wide = [line for line in lines if len(line.rstrip()) > 80]
        assert not wide, (name, wide)
        cut = [line for line in lines if "…" in line]
        assert not cut, (name, cut)

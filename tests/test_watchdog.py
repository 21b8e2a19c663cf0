"""The watchdog that stops a solver subprocess (CBC) which overruns its time limit."""

from __future__ import annotations

import subprocess
import time

from hetopt.search.watchdog import deadline_for_children


def test_a_child_that_overruns_is_killed_at_the_deadline():
    start = time.perf_counter()
    with deadline_for_children(0.5, names=("sleep",)) as watchdog:
        child = subprocess.Popen(["sleep", "30"])
        child.wait()
    assert time.perf_counter() - start < 5
    assert watchdog["killed"] == [child.pid] and child.returncode == -9


def test_a_child_that_finishes_in_time_is_left_alone():
    with deadline_for_children(5.0, names=("sleep",)) as watchdog:
        subprocess.run(["sleep", "0.1"], check=True)
    assert watchdog["killed"] == []

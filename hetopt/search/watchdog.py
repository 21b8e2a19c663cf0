"""Stopping a solver subprocess from outside when it overruns its time limit.

CBC runs as a child process (PuLP starts it) and honours its own time limit only once
branch-and-bound is under way; presolve or a huge LP can run past it. `deadline_for_children`
watches the child processes of this process whose command is one of `names` and kills them at the
deadline; the solve then returns without a solution and the search reports a time-out with its best
plan and bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path


def _children(names: tuple[str, ...]) -> list[int]:
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.find("(") + 1 : text.rfind(")")]
        ppid = int(text[text.rfind(")") + 2 :].split()[1])
        if ppid == me and comm in names:
            found.append(int(stat.parent.name))
    return found


def _kill(names: tuple[str, ...], outcome: dict) -> None:
    for pid in _children(names):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            outcome["killed"].append(pid)


@contextlib.contextmanager
def deadline_for_children(seconds: float, names: tuple[str, ...] = ("cbc",)) -> Iterator[dict]:
    """Kill matching child processes still running `seconds` from now, or at once when the block is
    left by an exception; yields {"killed": [pids]}."""
    outcome: dict = {"killed": []}
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            _kill(names, outcome)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield outcome
    except BaseException:  # Ctrl-C, SIGTERM: the solve is abandoned, its children go now
        _kill(names, outcome)
        raise
    finally:
        done.set()
        thread.join()

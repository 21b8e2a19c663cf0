"""Progress of long commands on stderr: a live status line on a terminal, else a log line per step.

A script or CI log that reads stderr gets plain lines it can follow (`[12 s] simulating: 1 of 2
scenarios replayed`), never the spinner's control characters: a line per step of the work, and for a
count that runs on (skeletons solved) at most one line per LOG_EVERY_S, so a search of thousands of
skeletons stays readable.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console

LOG_EVERY_S = 5.0
"""Off a terminal, the least time between two log lines of a running count."""


class Progress:
    """A status that a command updates as it goes.

    Parameters: console — where it goes (stderr); text — the first status."""

    def __init__(self, console: Console, text: str) -> None:
        self.console, self.start = console, time.monotonic()
        self.live = console.status(text) if console.is_terminal else None
        self.phase, self.logged_at = "", -LOG_EVERY_S
        if self.live is None:
            self._log(text)

    def __enter__(self) -> Progress:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Take the live line away (before printing a message of one's own)."""
        if self.live is not None:
            self.live.stop()

    def update(self, text: str, step: bool = True) -> None:
        """Show `text`; off a terminal, log it when it is a `step` of the work (a fold fitted, a
        scenario replayed), else — a count that runs on, as skeletons solved — when its phase (the
        words before ':') is new or LOG_EVERY_S after the last line."""
        if self.live is not None:
            self.live.update(text)
            return
        phase = text.split(":", 1)[0]
        now = time.monotonic()
        if step or phase != self.phase or now - self.logged_at >= LOG_EVERY_S:
            self._log(text)
        self.phase = phase

    def _log(self, text: str) -> None:
        self.logged_at = time.monotonic()
        self.console.print(
            f"[{self.logged_at - self.start:.0f} s] {text}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

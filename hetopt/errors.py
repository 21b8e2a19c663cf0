"""Errors a user can act on, and the exit codes of the CLI (docs/cli-output.md).

Bad input is never reported with a traceback: it becomes an :class:`InputError` that names the file,
the key path, the value given and the fix, and the CLI exits with :data:`EXIT_BAD_INPUT`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of every `hetopt` command."""

    OK = 0
    """Success."""
    FAILED = 1
    """Infeasible instance or solver failure; the reason is printed."""
    BAD_INPUT = 2
    """Bad input: the message names the file, the key path, the value and the fix."""
    INTERNAL = 3
    """A fault in hetopt itself: one line names it (the traceback with --debug); the input is not to
    blame."""


EXIT_BAD_INPUT = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, what was given, what is expected."""

    path: str
    """Key path inside the file, e.g. ``cluster.nodes[1].gpu``; empty for the whole file."""
    message: str
    """What is wrong and how to fix it, as a sentence."""
    value: object = None
    """The value the user gave (``None`` when the key is missing)."""
    has_value: bool = False
    line: int | None = None
    """1-based line in the file, when known."""

    def render(self) -> str:
        where = self.path
        if self.line is not None:
            where += f" (line {self.line})" if where else f"line {self.line}"
        given = f": got {_short_repr(self.value)}" if self.has_value else ""
        return f"{where}{given}: {self.message}" if where or given else self.message


@dataclass
class InputError(Exception):
    """A bad input file or option; carries every problem found, each with its key path."""

    source: str
    """The file (or option) the problems are in."""
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        head = f"error: {self.source}"
        if len(self.problems) == 1:
            only = self.problems[0]
            if only.path == self.source:  # an option's own problem: name it once
                return f"{head}{only.render()[len(only.path) :]}"
            return f"{head}: {only.render()}"
        lines = [f"{head}: {len(self.problems)} problems"]
        lines += [f"  - {p.render()}" for p in self.problems]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


class InfeasibleError(Exception):
    """The instance is well formed but has no plan; the message says which constraint binds."""


def did_you_mean(given: str, choices: Iterable[str], n: int = 3) -> str:
    """``" (did you mean 'A100-80GB'?)"`` for the closest choices, or an empty string."""
    choices = list(choices)
    near = difflib.get_close_matches(given, choices, n=n, cutoff=0.5)
    if not near:
        lowered = {c.lower(): c for c in choices}
        near = [
            lowered[c]
            for c in difflib.get_close_matches(given.lower(), list(lowered), n=n, cutoff=0.5)
        ]
    if not near:
        return ""
    return " (did you mean " + " or ".join(f"'{c}'" for c in near) + "?)"


def format_path(loc: Sequence[str | int]) -> str:
    """``('cluster', 'nodes', 1, 'gpu')`` → ``cluster.nodes[1].gpu``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_time_limit(seconds: float, option: str = "--time-limit") -> None:
    """A time limit is a finite number of seconds above 0 (typer reads "nan" and "inf" as floats,
    and a solver given either fails inside). Raises: InputError (exit 2)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise InputError(
            option,
            [
                Problem(
                    option, "must be a positive, finite number of seconds, e.g. 60", seconds, True
                )
            ],
        )

"""Output files: checked before any work starts, and written whole or not at all.

A command that runs for minutes must not lose its result at the last step, so every output path is
checked first (`check_output`: its directory exists and is writable, it is not a directory, its
extension is one the writer knows, and an existing file is replaced only with --force), and every
file is written to a temporary file beside it, then renamed over the target (`atomic_path`): a
reader sees the old file or the new one, never half of one, and a failed write leaves what was
there.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hetopt.errors import InputError, Problem

PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""What `--plot` can write (matplotlib's raster and vector formats; the format follows the
extension)."""


def check_output(
    path: str | Path, option: str, force: bool, suffixes: tuple[str, ...] = ()
) -> Path:
    """The path a command will write `option`'s file to, checked before any work.

    Parameters: path — as the user gave it; option — the command-line option, for the message; force
    — whether an existing file may be replaced; suffixes — the extensions the writer knows (() for
    any).
    Returns: the path. Raises: InputError (exit 2) naming the option, the path and the fix."""
    target = Path(path)

    def refuse(message: str) -> InputError:
        return InputError(str(path), [Problem(option, message, str(path), True)])

    if target.is_dir():
        raise refuse("is a directory; give a file path")
    if suffixes and not str(target).lower().endswith(suffixes):
        raise refuse(
            f"unknown extension {target.suffix or '(none)'!r}; use one of {', '.join(suffixes)}"
        )
    if target.exists() and not force:
        raise refuse("exists; pass --force to overwrite it or choose another path")
    check_directory(target.parent, option, str(path))
    return target


def check_output_directory(path: str | Path, option: str) -> Path:
    """A directory a command will create (with its parents) and fill: the nearest existing folder
    above it must be a writable directory, and the path itself no file. Raises: InputError (exit
    2)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InputError(
            str(path),
            [Problem(option, "is a file, not a directory; give a directory", str(path), True)],
        )
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    check_directory(existing, option, str(path))
    return target


def refuse_existing(paths, option: str, given: str, force: bool) -> None:
    """Refuse, before any work, to overwrite the files of `paths` that exist unless `force` (the
    command's --force). Raises: InputError (exit 2) naming them."""
    existing = [p for p in paths if Path(p).exists()]
    if existing and not force:
        raise InputError(
            option,
            [
                Problem(
                    option,
                    f"{', '.join(str(p) for p in existing)} already exist; pass --force to "
                    f"overwrite them or choose another {option}",
                    given,
                    True,
                )
            ],
        )


def check_directory(directory: Path, option: str, given: str) -> None:
    """The folder an output goes into exists, is a directory, and can be written. Raises:
    InputError."""
    folder = directory if str(directory) else Path(".")
    if not folder.exists():
        message = f"directory {folder} does not exist; create it or choose another path"
    elif not folder.is_dir():
        message = f"{folder} is not a directory; choose another path"
    elif not os.access(folder, os.W_OK | os.X_OK):
        message = f"directory {folder} is not writable; choose another path"
    else:
        return
    raise InputError(given, [Problem(option, message, given, True)])


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (same extension, so writers that pick a format by it still do)
    to write the whole file to; renamed over `path` when the block ends without error, removed
    otherwise. An OSError on the way (a full disk, a folder made read-only meanwhile) becomes an
    InputError."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, temp = tempfile.mkstemp(
            dir=directory, prefix=f".{target.name}.", suffix=f".part{target.suffix}"
        )
    except OSError as exc:
        raise _write_error(target, exc) from exc
    os.close(fd)
    temp_path = Path(temp)
    try:
        yield temp_path
        # mkstemp makes 0600; a plain open() would honour the umask
        os.chmod(temp_path, 0o666 & ~_umask())
        os.replace(temp_path, target)
    except OSError as exc:
        raise _write_error(target, exc) from exc
    finally:
        temp_path.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as temp:
        temp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, data: object, what: str) -> None:
    """Write `data` as indented JSON to `path` atomically; refuse (InputError, nothing written) if
    it holds a NaN or an infinity, which strict JSON parsers reject: a fit built on such numbers is
    no fit. `what` names the file kind in the message ("profile")."""
    try:
        text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        raise InputError(
            str(path),
            [
                Problem(
                    "",
                    f"the fitted {what} holds a number that is not finite (NaN or infinity), so "
                    "it is not written; check the input data for empty or degenerate rows",
                )
            ],
        ) from None
    write_text(path, text)


def _write_error(target: Path, exc: OSError) -> InputError:
    return InputError(
        str(target),
        [
            Problem(
                "",
                f"could not be written ({exc.strerror or exc}); free space or choose another path",
            )
        ],
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

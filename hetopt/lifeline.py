"""Every process hetopt starts ends with the `hetopt` command that started it, however that command ends.

A command (the *owner*) can end three ways, and its workers must not outlive any of them:

- **Ctrl-C or SIGTERM** (handlers run): `owner_signals` turns SIGTERM into `Terminated`, raised like
  Ctrl-C's KeyboardInterrupt, so the same clean-up runs on the way out. A pool left by an exception
  (`worker_pool`, executors.ProcessPool) kills its workers at once rather than waiting for their jobs to
  finish, and the command exits 130 (Ctrl-C) or 143 (SIGTERM), the codes a shell gives those signals.
- **SIGKILL** (the OOM killer, `timeout -s KILL`, a batch scheduler; no handler runs): each pool worker runs
  `bind_to_owner` first, a daemon thread that checks every OWNER_POLL_S whether its parent is still the
  owner (a dead parent's children are re-parented) and, once it is not, kills the worker's own children
  (a CBC run) and exits. The solvers hetopt calls release the GIL while they work, so the thread runs.
- **Solver binaries** the owner starts itself (CBC through PuLP): on Linux they get the kernel's
  parent-death signal (`prctl(PR_SET_PDEATHSIG)`, `children_die_with_me`); elsewhere the watchdog and the
  solver's own time limit stop them.

A local Ray that hetopt starts has fate sharing of its own for its head and its workers, but its per-node
agents outlive a killed owner by a minute (they wait 60 s to report the dead head to a GCS that is gone):
`Reaper`, a small process that holds a pipe from the owner, kills them when the pipe's end-of-file says
the owner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psutil

OWNER_POLL_S = 0.25
"""How often a worker checks that its owner is alive: a worker outlives a killed owner by about this."""
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
"""128 + the signal number: what a shell reports for a command ended by Ctrl-C or by SIGTERM."""


class Terminated(BaseException):
    """SIGTERM received: raised in the main thread like KeyboardInterrupt (not an Exception, so that no
    `except Exception` on the way out swallows it)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def owner_signals() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread for the duration of the block (the previous
    handler is restored after). Ctrl-C keeps Python's own KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (a test calling main() in a thread)
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def keep_sigterm_handler() -> Callable[[], None]:
    """The current SIGTERM handler, restored by calling the result (a library that sets its own, as
    ray.init does in a driver, would otherwise end the command without hetopt's clean-up)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    handler = signal.getsignal(signal.SIGTERM)
    return lambda: signal.signal(signal.SIGTERM, handler) if handler is not None else None


# -- pool workers ----------------------------------------------------------------------------------------

def bind_to_owner(owner_pid: int) -> None:
    """Run first in a pool worker: the worker ends (with its children) within OWNER_POLL_S of its owner.

    Parameters: owner_pid — the process that started the pool (its `os.getpid()`, passed at start, since
    the owner may already be gone when this runs).
    Ctrl-C is left to the owner, which stops its workers: a worker ignores SIGINT, so the terminal's
    Ctrl-C (sent to the whole process group) prints no traceback from each worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == owner_pid:
            time.sleep(OWNER_POLL_S)
        end_tree()

    threading.Thread(target=watch, name="hetopt-owner-watch", daemon=True).start()


def end_tree() -> None:
    """Kill this process's descendants, then exit at once (no clean-up: the owner that wanted the result
    is gone)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    os._exit(1)


def _init_pool_worker(owner_pid: int, initializer: Any, initargs: tuple) -> None:
    bind_to_owner(owner_pid)
    if initializer is not None:
        initializer(*initargs)


def new_pool(workers: int, initializer: Any = None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """Spawned worker processes bound to this process (`bind_to_owner`), then `initializer(*initargs)`.

    Spawn, not fork: the solver libraries keep thread pools that a forked child would inherit half-locked."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_pool_worker, initargs=(os.getpid(), initializer, initargs))


def stop_workers(executor: ProcessPoolExecutor) -> None:
    """Kill a pool's workers now and drop its queued jobs (an interrupt or an error is on its way out;
    `shutdown(wait=True)` would wait for every running job to finish)."""
    for process in multiprocessing.active_children():  # this process's workers, by the public API
        with contextlib.suppress(OSError):
            process.kill()
    executor.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def worker_pool(workers: int, initializer: Any = None, initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """`new_pool` for the block: shut down normally after it, its workers killed at once when the block
    ends by an exception (Ctrl-C, `Terminated`, an error)."""
    executor = new_pool(workers, initializer, initargs)
    try:
        yield executor
    except BaseException:
        stop_workers(executor)
        raise
    executor.shutdown()


# -- solver binaries -------------------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that created it ends."""


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl


_PRCTL = _prctl()  # looked up here, not in a forked child: the child only calls it


def _die_with_parent() -> None:
    """preexec_fn of a solver binary (runs in the child between fork and exec): SIGKILL when its parent
    thread ends, which for a solve is the thread that waits on it."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def _popen_dying(*args: Any, **kwargs: Any) -> subprocess.Popen:
    kwargs.setdefault("preexec_fn", _die_with_parent)
    return subprocess.Popen(*args, **kwargs)


def _dying_subprocess() -> types.ModuleType:
    """The `subprocess` module as a library sees it inside `children_die_with_me`: the same, but a Popen
    child is killed by the kernel when its parent ends."""
    module = types.ModuleType("subprocess")
    module.__dict__.update(vars(subprocess))
    module.Popen = _popen_dying
    return module


@contextlib.contextmanager
def children_die_with_me(module: types.ModuleType) -> Iterator[None]:
    """Within the block, processes that `module` (a library that runs solver binaries, e.g. PuLP's
    coin_api) starts with `subprocess.Popen` die with this process (Linux; elsewhere a no-op).

    PuLP offers no hook for how it starts CBC, so its module's `subprocess` name is swapped for the block
    only; solves run one at a time per process."""
    if _PRCTL is None or getattr(module, "subprocess", None) is not subprocess:
        yield
        return
    module.subprocess = _dying_subprocess()
    try:
        yield
    finally:
        module.subprocess = subprocess


# -- a reaper for what others start on the owner's behalf ----------------------------------------------------

REAPER_STARTUP_S, REAPER_STARTUP_POLL_S = 30.0, 0.05
"""A reaper looks at the owner's process tree every 0.05 s for its first 30 s (a local Ray starts its
processes then; a look takes about a millisecond per 60 processes), every OWNER_POLL_S after."""
MARK = "HETOPT_LIFELINE"
"""Environment variable that marks the processes started under `Reaper.marking`."""
GOODBYE = b"."
"""What the owner writes to its reaper before closing the pipe on purpose."""


class Reaper:
    """A process that kills the owner's descendants (as last seen) once the owner is gone, however it went.

    It reads a pipe whose only writer is the owner: end-of-file alone means the owner is gone (the kernel
    closes a dead process's pipes, SIGKILL included): kill; a byte before it means `close` was called: just
    exit. It watches the owner's process tree (REAPER_STARTUP_POLL_S), so what it kills is what ran a moment
    before the end."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.process = subprocess.Popen([sys.executable, "-m", "hetopt.lifeline", str(os.getpid()),
                                         self.token], stdin=subprocess.PIPE)

    @contextlib.contextmanager
    def marking(self) -> Iterator[None]:
        """Processes started within the block, and all they start, carry this reaper's mark in their
        environment (inherited through fork and exec, however far down or re-parented)."""
        previous = os.environ.get(MARK)
        os.environ[MARK] = self.token
        try:
            yield
        finally:
            if previous is None:
                del os.environ[MARK]
            else:
                os.environ[MARK] = previous

    def close(self, kill: bool = False) -> None:
        """Let the reaper go: without killing anything (the owner stopped what it started itself), or with
        `kill` after killing what it last saw below the owner (the owner is on its way out by an error)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                if not kill:
                    self.process.stdin.write(GOODBYE)
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def reap(owner_pid: int, token: str) -> None:
    """The reaper's loop (`python -m hetopt.lifeline OWNER_PID TOKEN`): kills what it saw below the owner
    and every process whose environment carries the owner's mark (one started a moment before the end, or
    re-parented before it was seen)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    me = os.getpid()
    try:
        owner = psutil.Process(owner_pid)
    except psutil.Error:
        return
    seen: dict[int, psutil.Process] = {}
    started = time.monotonic()
    while True:
        # closer looks while what it watches starts up (a process started between two looks is missed)
        period = REAPER_STARTUP_POLL_S if time.monotonic() - started < REAPER_STARTUP_S else OWNER_POLL_S
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], period)
        if readable:
            if os.read(sys.stdin.fileno(), 1) == GOODBYE:
                return  # closed by the owner: it shuts down what it started
            break  # end-of-file: the owner is gone
        with contextlib.suppress(psutil.Error):
            for p in owner.children(recursive=True):
                if p.pid != me:
                    seen.setdefault(p.pid, p)
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != me and p.pid not in seen and p.environ().get(MARK) == token:
                seen[p.pid] = p
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks the process's start time: a reused pid is not killed


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])

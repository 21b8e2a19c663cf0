"""Every process hetopt starts ends with the `hetopt` command that started it, however that command
ends.

A command (the *owner*) can end three ways, and its workers must not outlive any of them:

- **Ctrl-C or SIGTERM** (handlers run): `owner_signals` turns SIGTERM into `Terminated`, raised like
  Ctrl-C's KeyboardInterrupt, so the same clean-up runs on the way out. A pool left by an exception
  (`worker_pool`, executors.ProcessPool) kills its workers at once rather than waiting for their
  jobs to finish, and the command exits 130 (Ctrl-C) or 143 (SIGTERM), the codes a shell gives those
  signals.
- **SIGKILL** (the OOM killer, `timeout -s KILL`, a batch scheduler; no handler runs): each pool
  worker runs
  `bind_to_owner` first, a daemon thread that checks every OWNER_POLL_S whether its parent is still
  the owner (a dead parent's children are re-parented) and, once it is not, kills the worker's own
  children (a CBC run) and exits. The solvers hetopt calls release the GIL while they work, so the
  thread runs.
- **Solver binaries** the owner starts itself (CBC through PuLP): on Linux they get the kernel's
  parent-death signal (`prctl(PR_SET_PDEATHSIG)`, `children_die_with_me`); elsewhere the watchdog
  and the solver's own time limit stop them.

A local Ray that hetopt starts has fate sharing of its own for its head and its workers, but its
per-node agents outlive a killed owner by a minute (they wait 60 s to report the dead head to a GCS
that is gone): `Reaper`, a small process that holds a pipe from the owner, kills every process
started under its mark (an environment variable set while Ray starts) when the pipe's end-of-file
says the owner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
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
"""How often a worker checks that its owner is alive: a worker outlives a killed owner by about
this."""
MANAGER_JOIN_S = 5.0
"""How long a stopped pool waits for CPython's manager thread to end (its workers are already
dead)."""
EXIT_SIGTERM = 143
"""128 + 15: what a shell reports for a command ended by SIGTERM (Ctrl-C's 130 is typer's, 128 +
2)."""


class Terminated(BaseException):
    """SIGTERM received: raised in the main thread like KeyboardInterrupt (not an Exception, so that
    no `except Exception` on the way out swallows it)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def owner_signals() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread for the duration of the block (the previous
    handler is restored after). Ctrl-C keeps Python's own KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        # signal handlers can only be set from the main thread (a test calling main() in a thread)
        yield
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


# -- pool workers
# ----------------------------------------------------------------------------------------

HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM blocked in this thread for the block, so that a process spawned inside
    starts with them blocked, the way CPython starts its resource tracker (where the platform has no
    signal masks, a no-op). This thread may still be interrupted: another thread takes the signal
    and Python raises it here."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def bind_to_owner(owner_pid: int) -> None:
    """Run first in a pool worker: the worker ends (with its children) within OWNER_POLL_S of its
    owner.

    Parameters: owner_pid — the process that started the pool (its `os.getpid()`, passed at start,
    since the owner may already be gone when this runs). Ctrl-C is left to the owner, which stops
    its workers: a worker ignores SIGINT, so the terminal's Ctrl-C (sent to the whole process group)
    prints no traceback from each worker. It was spawned with SIGINT and SIGTERM blocked
    (`OwnedPool.submit`): one that came while it started is dropped here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)

    def watch() -> None:
        while os.getppid() == owner_pid:
            time.sleep(OWNER_POLL_S)
        exit_with_children()

    threading.Thread(target=watch, name="hetopt-owner-watch", daemon=True).start()


def kill_tree(pid: int, include_root: bool = True) -> None:
    """Kill a process's descendants, and the process itself with `include_root`; gone ones are
    skipped."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        if include_root:
            root.kill()


def _child_pids() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children()}
    except psutil.Error:
        return set()


def exit_with_children() -> None:
    """Kill this process's descendants, then exit this process at once (no clean-up: the owner that
    wanted its result is gone)."""
    kill_tree(os.getpid(), include_root=False)
    os._exit(1)


def _init_pool_worker(owner_pid: int, initializer: Any, initargs: tuple) -> None:
    bind_to_owner(owner_pid)
    if initializer is not None:
        initializer(*initargs)


class OwnedPool(ProcessPoolExecutor):
    """Spawned worker processes bound to this process (`bind_to_owner`), each running
    `initializer(*initargs)` after that.

    Spawn, not fork: the solver libraries keep thread pools that a forked child would inherit
    half-locked. Workers are spawned inside `submit` (also what `map` calls), where an interrupt
    must not leave one behind: a worker starts with Ctrl-C and SIGTERM blocked (`signals_held`), so
    that one reaching it in its start-up is dropped rather than printing a traceback; and one being
    spawned when the interrupt reaches this process, not yet among the pool's workers, is killed on
    the way out of `submit`."""

    def __init__(self, workers: int, initializer: Any = None, initargs: tuple = ()) -> None:
        super().__init__(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_pool_worker,
            initargs=(os.getpid(), initializer, initargs),
        )

    def submit(self, fn, /, *args, **kwargs):
        # CPython's record of this pool's workers (pid → process) and its worker limit (no public
        # API)
        may_spawn = len(getattr(self, "_processes", None) or {}) < getattr(self, "_max_workers", 0)
        before = _child_pids() if may_spawn else set()
        try:
            with signals_held():
                return super().submit(fn, *args, **kwargs)
        except BaseException:
            for pid in _child_pids() - before if may_spawn else ():
                # spawned during this submit, perhaps not yet recorded: `stop` would miss it
                kill_tree(pid)
            raise

    def stop(self) -> None:
        """Kill the workers (with whatever they started, a CBC run) now and drop the queued jobs: an
        interrupt or an error is on its way out, and `shutdown(wait=True)` would wait for every
        running job to finish."""
        manager = getattr(self, "_executor_manager_thread", None)  # CPython's; `shutdown` drops it
        for pid in list(getattr(self, "_processes", None) or {}):
            kill_tree(pid)
        self.shutdown(wait=False, cancel_futures=True)
        if manager is not None and manager is not threading.current_thread():
            # the manager closes its wake-up pipe as it ends, its workers dead; CPython 3.11's exit
            # hook (`_python_exit`) writes to that pipe unlocked and, racing the close, printed an
            # OSError traceback after a SIGTERM. Waited for here, the hook finds the pipe closed and
            # skips it.
            manager.join(timeout=MANAGER_JOIN_S)


@contextlib.contextmanager
def worker_pool(workers: int, initializer: Any = None, initargs: tuple = ()) -> Iterator[OwnedPool]:
    """An `OwnedPool` for the block: shut down normally after it, its workers killed at once when
    the block ends by an exception (Ctrl-C, `Terminated`, an error)."""
    executor = OwnedPool(workers, initializer, initargs)
    try:
        yield executor
    except BaseException:
        executor.stop()
        raise
    executor.shutdown()


# -- solver binaries
# -------------------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that created it ends."""


def _prctl() -> Any:
    """libc's prctl on Linux (glibc or musl: the symbols of the running process), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up here, not in a forked child: the child only calls it


def _dying_child(parent_pid: int) -> Callable[[], None]:
    """preexec_fn of a solver binary (runs in the child between fork and exec): SIGKILL when its
    parent thread ends, which for a solve is the thread that waits on it; at once if the parent
    already has."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        # the parent died before the signal was set: it will never come
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def _popen_dying(*args: Any, **kwargs: Any) -> subprocess.Popen:
    kwargs.setdefault("preexec_fn", _dying_child(os.getpid()))
    return subprocess.Popen(*args, **kwargs)


def _dying_subprocess() -> types.ModuleType:
    """The `subprocess` module as a library sees it inside `children_die_with_me`: the same, but a
    Popen child is killed by the kernel when its parent ends."""
    module = types.ModuleType("subprocess")
    module.__dict__.update(vars(subprocess))
    module.Popen = _popen_dying
    return module


@contextlib.contextmanager
def children_die_with_me(module: types.ModuleType) -> Iterator[None]:
    """Within the block, processes that `module` (a library that runs solver binaries, e.g. PuLP's
    coin_api) starts with `subprocess.Popen` die with this process (Linux; elsewhere a no-op).

    PuLP offers no hook for how it starts CBC, so its module's `subprocess` name is swapped for the
    block only; solves run one at a time per process."""
    if _PRCTL is None or getattr(module, "subprocess", None) is not subprocess:
        yield
        return
    module.subprocess = _dying_subprocess()
    try:
        yield
    finally:
        module.subprocess = subprocess


# -- a reaper for what others start on the owner's behalf
# ----------------------------------------------------

REAPER_STARTUP_S, REAPER_STARTUP_POLL_S = 30.0, 0.05
"""A reaper looks at the owner's process tree every 0.05 s for its first 30 s (a local Ray starts
its processes then; a look takes about a millisecond per 60 processes), every OWNER_POLL_S after."""
MARK = "HETOPT_LIFELINE"
"""Environment variable that marks the processes started under `Reaper.marking`."""
GOODBYE = b"."
"""What the owner writes to its reaper before closing the pipe on purpose."""


class Reaper:
    """A process that kills what the owner started under its mark once the owner is gone, however it
    went.

    What it kills: every process started inside `marking` and all they start in turn (the mark is an
    environment variable, inherited through fork and exec however far down or re-parented; the
    owner's tree is watched for those that blank it), and nothing else. When: it reads a pipe whose
    only writer is the owner; end-of-file alone means the owner is gone (the kernel closes a dead
    process's pipes, SIGKILL included) or closed it with `close(kill=True)`: kill; a byte before it
    means `close()`: just exit."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hetopt.lifeline", str(os.getpid()), self.token],
            stdin=subprocess.PIPE,
        )

    def marking(self) -> contextlib.AbstractContextManager:
        """Processes started within the block, and all they start, carry this reaper's mark in their
        environment (inherited through fork and exec, however far down or re-parented)."""
        return environment({MARK: self.token})

    def close(self, kill: bool = False) -> None:
        """Let the reaper go: without killing anything (the owner stopped what it started itself),
        or with `kill` after killing the marked processes (the owner is on its way out by an
        error)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                if not kill:
                    self.process.stdin.write(GOODBYE)
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set for the block, as it was after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reap(owner_pid: int, token: str) -> None:
    """The reaper (`python -m hetopt.lifeline OWNER_PID TOKEN`): until its stdin ends, notes the
    owner's descendants that were started under the mark (themselves marked, or below a marked
    process: Ray's agents rename themselves, which blanks the environment others can read); then,
    unless the owner said goodbye, kills those and every process still marked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    me, seen = os.getpid(), {}
    try:
        owner = psutil.Process(owner_pid)
    except psutil.Error:
        owner = None
    started = time.monotonic()
    while True:
        # closer looks while what it watches starts up (a process started between two looks is
        # missed)
        period = (
            REAPER_STARTUP_POLL_S if time.monotonic() - started < REAPER_STARTUP_S else OWNER_POLL_S
        )
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], period)
        if readable:
            if os.read(sys.stdin.fileno(), 1) == GOODBYE:
                return  # closed by the owner: it shut down what it started
            break  # end-of-file: the owner is gone, or on its way out by an error
        if owner is not None:
            seen.update(_marked_below(owner, token, me))
    for p in psutil.process_iter():
        # gone, or another user's (its environment is not readable)
        with contextlib.suppress(psutil.Error):
            if p.pid != me and p.environ().get(MARK) == token:
                seen.setdefault(p.pid, p)
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks the process's start time: a reused pid is not killed


def _marked_below(owner: psutil.Process, token: str, me: int) -> dict[int, psutil.Process]:
    """The owner's descendants started under the mark: marked themselves, or below a marked one."""
    try:
        below = {p.pid: p for p in owner.children(recursive=True) if p.pid != me}
    except psutil.Error:
        return {}
    marked: dict[int, bool] = {}

    def under_mark(p: psutil.Process) -> bool:
        if p.pid not in marked:
            try:
                own = p.environ().get(MARK) == token
                parent = below.get(p.ppid())
            except psutil.Error:
                own, parent = False, None
            marked[p.pid] = own or (parent is not None and under_mark(parent))
        return marked[p.pid]

    return {pid: p for pid, p in below.items() if under_mark(p)}


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])

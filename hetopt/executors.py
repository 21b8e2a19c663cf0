"""Where skeleton solves and bench sweeps run: worker processes on this machine, or a Ray cluster.

Two executors (docs/cli-output.md, `--executor`):

- `process` (the default; `local` is the same, the name docs/cli-output.md gives it): spawned worker
  processes on
  this machine (`concurrent.futures.ProcessPoolExecutor`), each given the search's context once.
- `ray`: Ray actors, each built once with the context (`ray.put` puts it in the object store a
  single
  time), and a Ray task per (instance, planner) run of a bench. Without `--address` a private local
  Ray is started on demand and shut down afterwards; with `--address HOST:PORT` (or `auto`) an
  existing cluster is joined and left running. Ray is the optional extra `pip install
  "hetopt[ray]"`.

Both serve the best-first search the same way: a batch of leaves in, their outcomes out in the same
order, so the search's order, its proof and its answer do not depend on the executor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import Any, Protocol

from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.lifeline import OwnedPool, Reaper, Terminated, environment, keep_sigterm_handler

EXECUTORS = ("process", "ray")
ALIASES = {"local": "process"}
"""docs/cli-output.md calls this machine's worker processes `local`; both names are accepted."""
RAY_INSTALL = 'pip install "hetopt[ray]"'
DEFAULT_LOCAL_WORKERS = 2
"""Worker processes (or local Ray workers) by default, at most the CPU count: the search's batches
are small, and more workers mostly solve leaves that a better incumbent would have pruned."""


def check_executor(executor: str, address: str | None = None) -> str:
    """The executor's canonical name, or bad input (exit 2) that says what to change.

    Parameters: executor — `process`, `local` (= process) or `ray`; address — a Ray cluster's
    address, only meaningful with `ray`.
    Returns: `process` or `ray`.
    Raises: InputError for an unknown name, an address without `ray`, or `ray` when Ray is not
    installed."""
    name = ALIASES.get(executor, executor)
    if name not in EXECUTORS:
        choices = [*EXECUTORS, *ALIASES]
        raise InputError(
            "--executor",
            [
                Problem(
                    "--executor",
                    f"unknown executor{did_you_mean(executor, choices)}; choose one of "
                    f"{', '.join(EXECUTORS)}",
                    executor,
                    True,
                )
            ],
        )
    if address is not None and name != "ray":
        raise InputError(
            "--address",
            [
                Problem(
                    "--address",
                    "is the address of a Ray cluster; add --executor ray or drop --address",
                    address,
                    True,
                )
            ],
        )
    if name == "ray":
        try:
            import ray  # noqa: F401  (only whether it imports)
        except ImportError as exc:
            raise InputError(
                "--executor",
                [
                    Problem(
                        "--executor",
                        f"Ray is not installed here ({exc}); install the optional extra: "
                        f"{RAY_INSTALL}",
                        executor,
                        True,
                    )
                ],
            ) from None
    return name


def default_workers() -> int:
    """Workers on this machine when none are asked for: DEFAULT_LOCAL_WORKERS, at most the CPU
    count."""
    return min(DEFAULT_LOCAL_WORKERS, os.cpu_count() or 1)


# -- a Ray session
# ---------------------------------------------------------------------------------------


@contextmanager
def ray_session(address: str | None, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, connected for the duration of the block.

    Parameters: address — an existing cluster (`HOST:PORT`, `ray://HOST:PORT` or `auto`); None
    starts a private local Ray with `num_cpus` CPUs (default: this machine's); num_cpus — ignored
    with an address (the cluster's nodes declared theirs at `ray start`).
    Returns: the `ray` module. A session that was already open (a caller's, or inside a Ray task) is
    used as it is and left open; one started here is shut down at the end of the block."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        _check_reachable(address)
    sigterm = keep_sigterm_handler()
    # Ray's agents outlive a killed hetopt by a minute: a reaper, started before them, ends them
    # (lifeline)
    reaper = Reaper() if address is None else None
    # Ray's C++ crash handler, installed in this driver by ray.init, turns a SIGTERM into an abort
    # with a stack dump; hetopt handles SIGTERM itself
    quiet = {
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": os.environ.get(
            "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1"
        )
    }
    try:
        try:
            # "local", not None: None would silently join whatever RAY_ADDRESS or a `ray start` on
            # this machine points at; without --address the user asked for a Ray of hetopt's own
            with (
                environment(quiet),
                reaper.marking() if reaper is not None else contextlib.nullcontext(),
            ):
                ray.init(
                    address=address or "local",
                    num_cpus=None if address else (num_cpus or os.cpu_count()),
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    configure_logging=True,
                )
        # a SIGTERM during ray.init meets Ray's driver handler: sys.exit(SIGTERM)
        except SystemExit as exc:
            if exc.code == signal.SIGTERM:
                raise Terminated() from None
            raise
        except (ConnectionError, ValueError, RuntimeError) as exc:
            if address is None:
                raise
            raise _cannot_join(address, exc) from None
        sigterm()  # ray.init set its own SIGTERM handler (sys.exit(15), without hetopt's clean-up)
        yield ray
    except BaseException:
        if ray.is_initialized():
            ray.shutdown()
        if reaper is not None:
            reaper.close(kill=True)  # what Ray started (marked) and did not stop goes too
        raise
    ray.shutdown()
    if reaper is not None:
        reaper.close()


def _cannot_join(address: str, exc: Exception) -> InputError:
    # Ray (2.5x on) starts a head with token authentication whenever ~/.ray/auth_token exists, but
    # sends a token to an explicit address only when told to: the most likely reason a listening
    # head refuses
    auth = (
        ""
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
        else (
            "; if the cluster uses token authentication, set RAY_AUTH_MODE=token and its token "
            "(`ray get-auth-token` on the head) in RAY_AUTH_TOKEN"
        )
    )
    return InputError(
        "--address",
        [
            Problem(
                "--address",
                f"cannot join a Ray cluster there ({exc}){auth}; or drop --address for a local Ray",
                address,
                True,
            )
        ],
    )


ADDRESS_PROBE_S = 5.0
"""How long to try a cluster's HOST:PORT before ray.init: Ray itself retries a wrong address for
minutes."""


def _check_reachable(address: str) -> None:
    """Bad input (exit 2) at once when nothing listens at a HOST:PORT address; other forms (`auto`)
    pass."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_PROBE_S).close()
    except OSError as exc:
        raise InputError(
            "--address",
            [
                Problem(
                    "--address",
                    f"no Ray cluster answers there ({exc}); start one with `ray start --head` "
                    "and give the HOST:PORT it prints, or drop --address for a local Ray",
                    address,
                    True,
                )
            ],
        ) from None


def ray_cpus_per_node(ray: ModuleType) -> int:
    """The most CPUs any live node of the connected cluster has (a task asking for more never
    starts)."""
    return max(
        [int(node["Resources"].get("CPU", 0)) for node in ray.nodes() if node.get("Alive")] or [1]
    )


# -- pools that solve a search's batches
# -------------------------------------------------------------------

Job = tuple
"""One leaf to solve: the arguments after the context (skeleton, seconds left, incumbent)."""
Solve = Callable[..., Any]
"""solve(context, *job) → outcome; a module-level function, so that it travels by reference."""


class SkeletonPool(Protocol):
    """Workers that each hold the search's context and solve jobs with it."""

    workers: int

    def map(self, jobs: Sequence[Job]) -> list:
        """The outcomes of `jobs`, in the order of `jobs`."""
        ...

    def submit(self, jobs: Sequence[Job]) -> Callable[[], list]:
        """Start `jobs` and return at once: calling the result waits for their outcomes, in job
        order."""
        ...

    def close(self) -> None:
        """Stop the workers (and a Ray this pool started) once their jobs are done."""
        ...

    def abort(self) -> None:
        """Stop the workers now, their jobs unfinished (Ctrl-C, SIGTERM or an error is on its way
        out)."""
        ...


def open_pool(
    executor: str,
    context: Any,
    solve: Solve,
    workers: int | None = None,
    address: str | None = None,
) -> SkeletonPool | None:
    """Workers for a search, or None when they would not help (one worker) or cannot start.

    Parameters: executor — `process` or `ray` (see check_executor); context — sent once to each
    worker;
    solve — called as solve(context, *job) in the workers; workers — how many (default:
    DEFAULT_LOCAL_WORKERS on this machine; with a Ray cluster at `address`, one per CPU of the
    cluster); address — a Ray cluster.
    Returns: a SkeletonPool, or None."""
    if executor == "ray":
        return RayPool.open(context, solve, workers, address)
    return ProcessPool.open(context, solve, workers if workers is not None else default_workers())


_CONTEXT: Any = None
_SOLVE: Solve | None = None


def _init_worker(context: Any, solve: Solve) -> None:
    global _CONTEXT, _SOLVE
    _CONTEXT, _SOLVE = context, solve


def _solve_one(job: Job):
    assert _SOLVE is not None, "worker started without _init_worker"
    return _SOLVE(_CONTEXT, *job)


class ProcessPool:
    """Spawned worker processes on this machine, the context given to each once at start."""

    def __init__(self, executor: OwnedPool, workers: int) -> None:
        self.executor, self.workers = executor, workers

    @classmethod
    def open(cls, context: Any, solve: Solve, workers: int) -> ProcessPool | None:
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if workers <= 1 or (main_file is not None and not os.path.exists(main_file)):
            # a spawned worker re-imports __main__, which a script read from stdin cannot be
            return None
        # each worker ends with this process, however it ends (hetopt.lifeline)
        return cls(OwnedPool(workers, _init_worker, (context, solve)), workers)

    def map(self, jobs: Sequence[Job]) -> list:
        return list(self.executor.map(_solve_one, jobs))

    def submit(self, jobs: Sequence[Job]) -> Callable[[], list]:
        futures = [self.executor.submit(_solve_one, job) for job in jobs]
        return lambda: [f.result() for f in futures]

    def close(self) -> None:
        self.executor.shutdown()

    def abort(self) -> None:
        self.executor.stop()


class _SkeletonActor:
    """A Ray actor's state: the context, fetched from the object store once when the actor
    starts."""

    def __init__(self, context: Any, solve: Solve) -> None:
        self.context, self.solve_fn = context, solve

    def solve(self, job: Job):
        return self.solve_fn(self.context, *job)


class RayPool:
    """Ray actors (one CPU each) holding the context; a batch is spread over them as they become
    free."""

    def __init__(self, ray: ModuleType, session: ExitStack, actors: list, workers: int) -> None:
        from ray.util import ActorPool

        self.ray, self.session, self.actors, self.workers = ray, session, actors, workers
        self.pool = ActorPool(actors)

    @classmethod
    def open(
        cls, context: Any, solve: Solve, workers: int | None, address: str | None
    ) -> RayPool | None:
        local = workers if workers is not None else default_workers()
        if address is None and local <= 1:
            return None  # one worker: the search solves in-process, as with the process pool
        session = ExitStack()
        try:
            ray = session.enter_context(ray_session(address, num_cpus=local))
            cpus = int(ray.cluster_resources().get("CPU", 1))
            # each actor holds one CPU: more actors than the cluster has CPUs would wait for ever
            n = min(
                workers if workers is not None else (cpus if address is not None else local), cpus
            )
            if n <= 1:
                session.close()
                return None
            ref = ray.put(context)  # once into the object store; each actor fetches it once
            actor = ray.remote(num_cpus=1)(_SkeletonActor)
            return cls(ray, session, [actor.remote(ref, solve) for _ in range(n)], n)
        except BaseException:
            session.close()
            raise

    def map(self, jobs: Sequence[Job]) -> list:
        return list(self.pool.map(lambda actor, job: actor.solve.remote(job), jobs))

    def submit(self, jobs: Sequence[Job]) -> Callable[[], list]:
        # a batch is 2 jobs per actor: dealt out in turn, each actor's queue keeps it busy
        refs = [self.actors[i % len(self.actors)].solve.remote(job) for i, job in enumerate(jobs)]
        return lambda: self.ray.get(refs)

    def close(self) -> None:
        try:
            for actor in self.actors:
                self.ray.kill(actor)
        finally:
            self.session.close()

    def abort(self) -> None:
        self.close()  # ray.kill does not wait for a running job

"""Maintenance: the housekeeping a queue needs, every task in one shape.

Each task is an object built with validated settings (bad settings raise at
construction, not at 3 a.m.) whose ``run_once()`` does one pass and returns counters
(``{"failed": 2}``). :class:`Maintenance` runs them all and prefixes each counter with
its task's name; :func:`maintain` is the one-call form the CLI and the worker use, and
``Pipeline.run(maintenance=...)`` puts the counters in that run's summary.

Tasks:
- :class:`StuckJobs`: running jobs whose lock is stale on their last attempt are failed,
  and their give-up hooks (and any still owed) run (docs/design.md, "Stuck jobs"
  and "Give-up hooks").
- :class:`KilledRuns`: runs silent for longer than the queue's stale window are marked
  ended with stop reason ``error`` and error ``killed``.
- :class:`PruneDoneJobs`: done jobs older than the retention period are deleted (never
  inside the served window, which the fair claim still counts), quota usage of periods
  older than it, and finished runs older than the runs' retention.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from . import statements as sql
from .checks import positive_int, require_duration, seconds_text
from .errors import ConfigError, InvalidInput
from .queue import Queue
from .settings import DEFAULT_PLATFORM_TIMEOUT
from .store import AnyConn, Store


class Prune(Protocol):
    """A pruning statement's function (:func:`rota.statements.prune_done`,
    :func:`rota.statements.prune_runs`): deletes one batch, returns how many."""

    async def __call__(self, store: Store, *, retention: timedelta, batch_size: int,
                       offset: timedelta, conn: AnyConn | None = None) -> int: ...

DEFAULT_RETENTION = timedelta(days=7)
#: How long finished runs are kept: a month of history for ``rota runs``.
DEFAULT_RUNS_RETENTION = timedelta(days=30)


class Maintainer(Protocol):
    """The shape every maintenance service has (the claim's upkeep,
    :class:`rota.fair.ClaimUpkeep`, too): a name for its counters and ``run_once``."""

    name: str

    async def run_once(self) -> dict[str, int]:
        """Do one pass; return counters of what it did."""
        ...


class StuckJobs:
    """Fail stuck jobs and run owed give-up hooks (docs/design.md, "Stuck jobs"
  and "Give-up hooks").

    A job ``running`` with a lock older than ``queue.stale_after`` and no attempts left
    will never be reclaimed: it is failed (error text says so) and its type's give-up
    hook runs exactly once. Hooks still owed from earlier give-ups (a process died
    between the give-up and its hook) run too, for the types this process registered.

    Counters: ``failed`` (jobs failed now; their hooks run with them), ``hooks_run``
    (hooks that were owed from earlier give-ups and ran now).
    """

    name = "stuck_jobs"

    def __init__(self, queue: Queue) -> None:
        self.queue = _check_queue(queue)

    async def run_once(self) -> dict[str, int]:
        owed = 0
        while ran := await self.queue.run_give_up_hooks():  # 1,000 at a time
            owed += ran
        stuck = await self.queue.fail_stuck_jobs()
        return {"failed": len(stuck), "hooks_run": owed}


class KilledRuns:
    """Mark runs that were killed (docs/design.md, "Maintenance").

    A run saves its progress after every batch and every heartbeat (at least every half
    platform timeout, which is shorter than the stale window); a run whose row is
    unfinished and has been silent for longer than the queue's stale window
    (``stale_after``) cannot be alive, and its jobs are being reclaimed, so it is marked
    finished with stop reason ``error`` and error ``killed``, at its last sign of life.
    The stale window is the one rule for "dead" (docs/design.md, "Stale locks"), known
    to every process that has the queue, app or not. Should it turn out alive after
    all, its own end overwrites the mark.

    Args:
        queue: the queue (its ``stale_after``).
        platform_timeout: ignored, kept so that callers written when killed runs were
            marked after the platform timeout still work.

    Counters: ``marked``.
    """

    name = "killed_runs"

    def __init__(self, queue: Queue, *,
                 platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT) -> None:
        self.queue = _check_queue(queue)
        require_duration(platform_timeout, "platform_timeout")

    async def run_once(self) -> dict[str, int]:
        q = self.queue
        async with q.connection() as c:
            rows = await sql.killed_runs(q.store, stale_after=q.stale_after,
                                         offset=q.clock_offset, conn=c)
        return {"marked": len(rows)}

    async def next_in(self) -> float | None:
        """Seconds until the next unfinished run will have been silent for the stale
        window (0 or less: one is due to be marked now), or ``None``: none is
        unfinished. The worker wakes for it."""
        q = self.queue
        async with q.connection() as c:
            return await sql.killed_runs_next(q.store, stale_after=q.stale_after,
                                              offset=q.clock_offset, conn=c)


class PruneDoneJobs:
    """Delete done jobs finished longer ago than ``retention`` (docs/design.md, "Maintenance"),
    in batches of ``batch_size`` (each its own short transaction), quota usage rows
    of periods that began before it, and finished runs started longer ago than
    ``runs_retention`` (in batches too). Pending, running and failed jobs, and
    unfinished runs, are never pruned.

    Args:
        queue: the queue.
        retention: how long done jobs are kept (default 7 days); at least
            ``queue.served_window``, since the fair claim counts done jobs in it.
        batch_size: jobs (or runs) deleted per statement, > 0.
        runs_retention: how long finished runs are kept (default 30 days).

    Raises:
        ConfigError: ``retention`` shorter than the queue's served window.

    Counters: ``jobs_deleted``, ``quota_rows_deleted``, ``runs_deleted``.
    """

    name = "prune"

    def __init__(self, queue: Queue, *, retention: timedelta = DEFAULT_RETENTION,
                 batch_size: int = 10_000,
                 runs_retention: timedelta = DEFAULT_RUNS_RETENTION) -> None:
        self.queue = _check_queue(queue)
        self.retention = require_duration(retention, "retention")
        if self.retention < queue.served_window:
            raise ConfigError(
                f"retention ({seconds_text(self.retention)}) must not be shorter than the "
                f"served window ({seconds_text(queue.served_window)}): the fair claim still "
                f"counts those done jobs")
        self.batch_size = positive_int(batch_size, "batch_size")
        self.runs_retention = require_duration(runs_retention, "runs_retention")

    async def run_once(self) -> dict[str, int]:
        q = self.queue
        deleted = await self._in_batches(sql.prune_done, self.retention)
        async with q.connection() as c:
            quota_rows = await sql.prune_quota_usage(q.store, retention=self.retention,
                                                     offset=q.clock_offset, conn=c)
        runs = await self._in_batches(sql.prune_runs, self.runs_retention)
        return {"jobs_deleted": deleted, "quota_rows_deleted": quota_rows,
                "runs_deleted": runs}

    async def _in_batches(self, prune: Prune, retention: timedelta) -> int:
        q = self.queue
        deleted = 0
        while True:
            async with q.connection() as c:
                n = await prune(q.store, retention=retention, batch_size=self.batch_size,
                                offset=q.clock_offset, conn=c)
            deleted += n
            if n < self.batch_size:
                return deleted


class Rescue:
    """The worker's frequent pass between full maintenance runs: stuck jobs (with owed
    give-up hooks) and killed runs, both index reads. The worker also runs it when the
    next unfinished run passes the stale window (:meth:`next_killed_in`), so a run
    killed by a SIGKILL is marked as soon as that can be known, not at the next daily
    maintenance (docs/design.md, "Maintenance").

    Args:
        queue: the queue.
        platform_timeout: ignored (see :class:`KilledRuns`).

    Counters: ``stuck_jobs.failed``, ``stuck_jobs.hooks_run``, ``killed_runs.marked``.
    """

    name = "rescue"

    def __init__(self, queue: Queue,
                 platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT) -> None:
        self.killed = KilledRuns(queue, platform_timeout=platform_timeout)
        self.tasks: tuple[Maintainer, ...] = (StuckJobs(queue), self.killed)

    async def run_once(self) -> dict[str, int]:
        """Run both tasks once; counters as ``"TASK.COUNTER"``."""
        return await run_tasks(self.tasks)

    async def next_killed_in(self) -> tuple[float | None]:
        """:meth:`KilledRuns.next_in`, as a one-tuple (so that a caller waiting for it or
        a stop request can tell "no unfinished run" from "stopped")."""
        return (await self.killed.next_in(),)


async def run_tasks(tasks: tuple[Maintainer, ...]) -> dict[str, int]:
    """Run maintenance tasks in order; their counters as ``"TASK.COUNTER"``."""
    out: dict[str, int] = {}
    for task in tasks:
        for key, value in (await task.run_once()).items():
            out[f"{task.name}.{key}"] = value
    return out


class Maintenance:
    """All maintenance tasks of a queue, run in order: stuck jobs, killed runs, prune.

    Args:
        queue: the queue (its registered give-up hooks run for stuck jobs).
        platform_timeout: ignored (see :class:`KilledRuns`).
        retention: see :class:`PruneDoneJobs` (default 7 days).
        prune_batch_size: see :class:`PruneDoneJobs`.
        runs_retention: see :class:`PruneDoneJobs` (default 30 days).

    Raises:
        ConfigError, InvalidInput: a task's settings are invalid.

    Attributes:
        queue: the queue given; :meth:`rota.Pipeline.run` takes a ``Maintenance`` built
            on the pipeline's own queue, ``pipeline.queue``, only.
    """

    name = "maintenance"

    def __init__(self, queue: Queue, *,
                 platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT,
                 retention: timedelta = DEFAULT_RETENTION,
                 prune_batch_size: int = 10_000,
                 runs_retention: timedelta = DEFAULT_RUNS_RETENTION) -> None:
        self.queue = _check_queue(queue)
        self.tasks: tuple[Maintainer, ...] = (
            StuckJobs(queue),
            KilledRuns(queue, platform_timeout=platform_timeout),
            PruneDoneJobs(queue, retention=retention, batch_size=prune_batch_size,
                          runs_retention=runs_retention),
        )

    async def run_once(self) -> dict[str, int]:
        """Run every task once.

        Returns:
            Counters as ``"TASK.COUNTER"``: ``stuck_jobs.failed``,
            ``stuck_jobs.hooks_run``, ``killed_runs.marked``, ``prune.jobs_deleted``,
            ``prune.quota_rows_deleted``, ``prune.runs_deleted``.
        """
        return await run_tasks(self.tasks)


def check_pipeline_maintenance(maintenance: object, pipeline_queue: Queue) -> None:
    """Refuse a :class:`Maintenance` built on another queue than a pipeline's own
    (``pipeline.queue``), given to run with that pipeline: its stuck jobs would give up
    without the stages' give-up hooks, which live on the pipeline's queue
    (docs/design.md, "The runner"). Any other maintainer is taken as it is.

    Raises:
        ConfigError: saying to build it on ``pipeline.queue``.
    """
    if isinstance(maintenance, Maintenance) and maintenance.queue is not pipeline_queue:
        raise ConfigError(
            "maintenance is built on another queue than the pipeline's, so the "
            "stages' give-up hooks would not run for its stuck jobs: build it on "
            "pipeline.queue (rota.Maintenance(pipeline.queue, ...))")


async def maintain(queue: Queue, *,
                   platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT,
                   retention: timedelta = DEFAULT_RETENTION) -> dict[str, int]:
    """Run all maintenance once (``rota maintain``, and daily in the worker); see
    :class:`Maintenance` for the arguments, errors and counters."""
    return await Maintenance(queue, platform_timeout=platform_timeout,
                             retention=retention).run_once()


def _check_queue(queue: object) -> Queue:
    if not isinstance(queue, Queue):
        raise InvalidInput("maintenance needs a rota.Queue")
    return queue


__all__ = [
    "DEFAULT_RETENTION",
    "DEFAULT_RUNS_RETENTION",
    "KilledRuns",
    "Maintainer",
    "Maintenance",
    "PruneDoneJobs",
    "StuckJobs",
    "maintain",
]

"""The pipeline runner: stages, the run loop, the time budget and stop reasons
(DESIGN: "The runner").

A :class:`Pipeline` is an ordered list of :class:`Stage` objects. One call of
:meth:`Pipeline.run` is one *run* (one row of ``runs``): it claims one batch from the
first stage that has work, runs it with the stage's concurrency, and starts again from
the top, until there is no work, the time budget is spent, or only quota-blocked work is
left. Handlers get a :class:`JobContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn, Protocol, get_args

import psycopg

from .errors import ConfigError, InvalidInput
from .job import DeferJob, FailOutcome, Job, require_duration, require_text, storable_text
from .queue import AnyConn, GiveUpHook, Queue
from .quota import SHARED_SCOPE, Allowance, Quota, QuotaExhausted

log = logging.getLogger("rota.runner")

Trigger = Literal["cron", "cli", "worker", "manual"]
StopReason = Literal["no_work", "time_budget", "quota_reserve", "quota_exhausted", "error"]
TRIGGERS: tuple[str, ...] = get_args(Trigger)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)

DEFAULT_PLATFORM_TIMEOUT = timedelta(seconds=300)
DEFAULT_TIME_BUDGET = timedelta(seconds=220)

# Waits between attempts to record a run's end after a connection failure (about 7 s in
# all: a fast restart of PostgreSQL takes well under that).
_END_RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0, 4.0)
# Between batches the runs row is saved at most this often (seconds); the heartbeat and
# the end of the run save it too. A save per batch cost a commit per 25 jobs.
SAVE_EVERY_S = 1.0

Handler = Callable[["JobContext"], Awaitable[None]]
BatchHandler = Callable[[list["JobContext"]], Awaitable[None]]
Outcome = Literal["done", "retry", "failed", "deferred", "lost"]


class Maintainer(Protocol):
    """Anything with the maintenance shape (see :mod:`rota.maintenance`)."""

    async def run_once(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class Stage:
    """A job type and how the runner handles it (DESIGN: stage).

    Args:
        type: the job type this stage claims.
        batch: jobs claimed at once, > 0.
        concurrency: how many of the batch's jobs run at the same time, > 0 (for a
            ``handler``; a ``batch_handler`` is one call for the whole batch).
        handler: ``async def handler(ctx: JobContext) -> None``, run once per job. It
            returns to complete the job, raises ``DeferJob(until)`` to defer it,
            lets :class:`~rota.quota.QuotaExhausted` through to defer it to the
            quota's reset, and raises anything else to fail it (retry with backoff,
            then failed). It may also settle the job itself with ``ctx.complete()``,
            ``ctx.fail()`` or ``ctx.defer()``.
        batch_handler: ``async def batch_handler(ctxs: list[JobContext]) -> None``,
            instead of ``handler``: one call for the whole claimed batch (for an API
            that takes many items in one request). It settles jobs one by one through
            their contexts; jobs it leaves unsettled are completed when it returns,
            or all deferred/failed as above when it raises.
        max_attempts: attempts for jobs of this type; the pipeline sets it as the
            queue's per-type setting, so it applies to jobs enqueued from then on.
        quota: the shared quota this stage spends. Before each claim the runner checks
            it: when spending ``quota_cost`` would dip into the reserve (or cannot be
            paid at all), the stage is skipped for the rest of the run and its pending
            jobs wait for the reset.
        quota_cost: units one job (one batch call, for a ``batch_handler``) typically
            spends of ``quota``, > 0. Handlers spend actual units with ``ctx.spend``.
        on_give_up: a give-up hook for this type (see :meth:`rota.Queue.on_give_up`).
            Without one (and none registered on the queue), the pipeline registers a
            no-op, so this type's give-ups are recorded as handled, not owed forever.
        prefetch: claim the next batch while this one runs (default off). For stages
            whose handlers wait on I/O (an API call) with a backlog: the claim
            overlaps the batch's handlers (``make bench``: 1.3-1.45x jobs/s with 5 ms
            handlers, batch and concurrency 100; nothing for no-op handlers, bound by
            the database). Only the pipeline's first stage not skipped in the
            run prefetches (earlier stages win, so no later stage may run ahead of them),
            never a stage with a ``quota`` (its check comes before each claim). The
            prefetched jobs are held like the running batch (heartbeats keep their
            locks); when the run ends before starting them (budget, error) they are
            handed back untouched (:meth:`rota.Queue.release`). Leave it off when
            several workers share a stage of long handlers: a prefetched batch waits,
            held, while another worker could run it.

    Raises:
        InvalidInput: bad sizes, not exactly one of ``handler`` and ``batch_handler``.
    """

    type: str
    batch: int
    concurrency: int = 1
    handler: Handler | None = None
    _: KW_ONLY
    batch_handler: BatchHandler | None = None
    max_attempts: int | None = None
    quota: Quota | None = None
    quota_cost: int = 1
    on_give_up: GiveUpHook | None = None
    prefetch: bool = False

    def __post_init__(self) -> None:
        require_text(self.type, "stage type")
        for name in ("batch", "concurrency", "quota_cost"):
            _check_int(getattr(self, name), f"stage {self.type!r}: {name}")
        if self.max_attempts is not None:
            _check_int(self.max_attempts, f"stage {self.type!r}: max_attempts")
        if (self.handler is None) == (self.batch_handler is None):
            raise InvalidInput(
                f"stage {self.type!r}: give exactly one of handler and batch_handler")
        if not isinstance(self.prefetch, bool):
            raise InvalidInput(f"stage {self.type!r}: prefetch must be True or False, "
                               f"got {self.prefetch!r}")
        if self.quota is not None and not isinstance(self.quota, Quota):
            raise InvalidInput(f"stage {self.type!r}: quota must be a rota.Quota "
                               f"(per-owner allowances are spent by handlers)")


@dataclass(frozen=True)
class RunResult:
    """What one run did; the same values as its ``runs`` row.

    Attributes:
        run_id: the ``runs`` row's id.
        trigger: ``cron``, ``cli``, ``worker`` or ``manual``.
        stop_reason: ``no_work``, ``time_budget``, ``quota_reserve``,
            ``quota_exhausted`` (healthy) or ``error`` (an incident; see ``error``).
        jobs_done: jobs completed.
        jobs_failed: jobs that ended ``failed`` (gave up) in this run; failed attempts
            that will be retried are counted in ``summary["retries"]``.
        jobs_deferred: jobs put back without burning an attempt (``DeferJob``, quota
            resets, claimed-but-unstarted jobs at the end of the budget).
        quota_units: units of shared quotas spent through ``ctx.spend``.
        summary: counters: the handlers' (``ctx.count``), ``quota.NAME`` and
            ``allowance.NAME`` units, the runner's (``retries``, ``lost``,
            ``postponed``, ``quota_deferred``) and ``maintenance.*`` when it ran.
        error: the error text when ``stop_reason == "error"``.
        started_at, finished_at: aware instants on the queue's clock.
    """

    run_id: uuid.UUID
    trigger: str
    stop_reason: StopReason
    jobs_done: int
    jobs_failed: int
    jobs_deferred: int
    quota_units: int
    summary: dict[str, int | float]
    error: str | None
    started_at: datetime
    finished_at: datetime


class _Run:
    """One run's mutable state: counters, the claims it holds, skipped stages."""

    def __init__(self, run_id: uuid.UUID, trigger: str, budget: timedelta) -> None:
        self.id = run_id
        self.trigger = trigger
        self.deadline = time.monotonic() + budget.total_seconds()
        self.jobs_done = 0
        self.jobs_failed = 0
        self.jobs_deferred = 0
        self.quota_units = 0
        self.summary: dict[str, int | float] = {}
        self.held: dict[int, JobContext] = {}       # claimed and not yet settled
        self.skipped: set[str] = set()               # stage types blocked by quota
        self.blocked: set[str] = set()               # reasons with quota-blocked work
        self.finishing: asyncio.Task[None] | None = None  # last batch's completion
        self.prefetched: tuple[Stage, asyncio.Task[list[Job]]] | None = None
        self.saved_at = -1e9  # monotonic time of the last save of the runs row

    def time_left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def add(self, name: str, n: int | float = 1) -> None:
        self.summary[name] = self.summary.get(name, 0) + n

    def save_params(self) -> dict[str, Any]:
        return {"id": self.id, "jobs_done": self.jobs_done, "jobs_failed": self.jobs_failed,
                "jobs_deferred": self.jobs_deferred, "quota_units": self.quota_units,
                "summary": json.dumps(self.summary, sort_keys=True)}


class JobContext:
    """What a handler gets for one claimed job.

    Attributes:
        job: the claimed :class:`rota.Job` (``attempts`` already counts this attempt).
        queue: the :class:`rota.Queue`.
        run_id: the run's id (``runs.id``).
        stage: the :class:`Stage` running it.
    """

    def __init__(self, job: Job, queue: Queue, stage: Stage, run: _Run,
                 pipeline: Pipeline) -> None:
        self.job = job
        self.queue = queue
        self.stage = stage
        self.run_id = run.id
        self._run = run
        self._pipeline = pipeline
        self.started = False
        self.outcome: Outcome | None = None

    @property
    def settled(self) -> bool:
        """Whether the job was completed, failed or deferred (or found lost)."""
        return self.outcome is not None

    def time_left(self) -> timedelta:
        """Time left in the run's budget (never negative). A handler with long work
        ahead may raise ``DeferJob`` when it is short."""
        return timedelta(seconds=self._run.time_left())

    def count(self, name: str, n: int | float = 1) -> None:
        """Add ``n`` to the run summary's counter ``name`` (``"drafts_written"``,
        ``"tokens"``…), saved in the ``runs`` row.

        Raises:
            InvalidInput: empty name, or ``n`` not a finite int/float.
        """
        require_text(name, "counter name")
        if (not isinstance(n, int | float) or isinstance(n, bool)
                or (isinstance(n, float) and not math.isfinite(n))):
            raise InvalidInput(f"counter {name!r}: n must be a finite number, got {n!r}")
        self._run.add(name, n)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AnyConn]:
        """A connection from the queue's pool for the handler's own queries (committed
        on exit for a pool that is not autocommit). Do not hold it across slow calls:
        connections are shared by all jobs in flight."""
        async with self.queue.connection() as conn:
            yield conn

    async def spend(self, quota: Quota | Allowance | str, units: int = 1) -> int | None:
        """Spend units of a shared quota, or of the job's owner's allowance, atomically
        in the database; committed at once, whatever the handler does next.

        A shared quota is never spent into its reserve by a run. When the units are not
        there, :class:`~rota.quota.QuotaExhausted` is raised; let it propagate and the
        runner defers the job to the reset (no attempt burned) and, for a shared quota,
        skips this stage for the rest of the run.

        Args:
            quota: a :class:`Quota`, an :class:`Allowance`, or the name of one given to
                the pipeline.
            units: int > 0.

        Returns:
            Units left in the period (for an allowance, ``None`` when none applies).

        Raises:
            QuotaExhausted: not enough units; nothing was spent.
            ConfigError: an unknown quota name.
        """
        q = self._pipeline.quota(quota) if isinstance(quota, str) else quota
        if isinstance(q, Quota):
            left: int | None = await q.spend(self.queue, units)
            self._run.quota_units += units
            self._run.add(f"quota.{q.name}", units)
            return left
        left = await q.spend(self.queue, self.job.group_id, units)
        if left is not None:
            self._run.add(f"allowance.{q.name}", units)
        return left

    async def exhaust(self, quota: Quota | Allowance | str) -> NoReturn:
        """The provider said the quota is spent (for example the YouTube Data API's
        ``quotaExceeded``): record it as used up until the reset, and raise
        :class:`~rota.quota.QuotaExhausted` so the runner defers this job to the reset.
        For an allowance when none applies to this job, raises ``DeferJob`` (due now).
        """
        q = self._pipeline.quota(quota) if isinstance(quota, str) else quota
        if isinstance(q, Quota):
            raise await q.exhaust(self.queue)
        exc = await q.exhaust(self.queue, self.job.group_id)
        if exc is None:
            raise DeferJob(None, f"allowance {q.name!r} reported exhausted")
        raise exc

    async def complete(self, *, conn: AnyConn | None = None) -> bool:
        """Mark the job done now (the runner does it when the handler returns).

        Args:
            conn: complete inside the handler's own transaction, so the job is done
                if and only if the handler's writes commit. If that transaction rolls
                back, the job stays running under this claim until its lock goes
                stale; prefer raising in that case.

        Returns:
            ``False`` when this run lost the job (reclaimed after a stale lock).
        """
        self._check_unsettled()
        ok = await self.queue.complete(self.job, conn=conn)
        self._settle("done" if ok else "lost")
        return ok

    async def fail(self, error: BaseException | str) -> FailOutcome:
        """Record a failed attempt now (retry with backoff, or failed with give-up
        hook); see :meth:`rota.Queue.fail`."""
        self._check_unsettled()
        outcome = await self.queue.fail(self.job, error)
        self._settle(outcome)
        return outcome

    async def defer(self, until: datetime | None = None) -> bool:
        """Put the job back without burning an attempt, due at ``until`` (``None``:
        as soon as possible); see :meth:`rota.Queue.defer`. A run never runs a job it
        deferred: a time before the run's budget ends becomes the end of the budget.

        Returns:
            ``False`` when this run lost the job, or it gave up on its deferral cap.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
        """
        self._check_unsettled()
        ok = await self.queue.defer(self.job, await self._after_this_run(until)) == 1
        if ok:
            self._settle("deferred")
        else:
            now = await self.queue.get_job(self.job.id)
            gave_up = (now is not None and now.status == "failed"
                       and now.run_id == self.run_id)
            self._settle("failed" if gave_up else "lost")
        return ok

    async def _after_this_run(self, until: datetime | None) -> datetime | None:
        # A run never runs a job it deferred: a job deferred to a time before the budget
        # ends is due when it ends, or it would be claimed again at once, and again.
        left = self._run.time_left()
        if left <= 0:
            return until  # no more claims in this run
        floor = await self.queue.now() + timedelta(seconds=left)
        return floor if until is None or until < floor else until

    def _check_unsettled(self) -> None:
        if self.outcome is not None:
            raise InvalidInput(f"job {self.job.id} is already settled ({self.outcome})")

    def _settle(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._run.held.pop(self.job.id, None)
        run = self._run
        if outcome == "done":
            run.jobs_done += 1
        elif outcome == "failed":
            run.jobs_failed += 1
        elif outcome == "deferred":
            run.jobs_deferred += 1
        elif outcome == "retry":
            run.add("retries")
        else:
            run.add("lost")


class Pipeline:
    """An ordered list of stages run against one queue (DESIGN: "The runner").

    Args:
        queue: the :class:`rota.Queue`.
        stages: in runner order: earlier stages win (put work-generating stages last).
        quotas: quotas and allowances handlers may name in ``ctx.spend("name", n)``
            (stages' quotas are added automatically).
        platform_timeout: how long the platform lets one invocation live (default 300 s).
            The queue's stale window must be longer, so a lock only looks stale when its
            holder is dead; runs' budgets must be shorter.
        heartbeat_every: how often a run refreshes the locks of the jobs it holds and
            saves its progress (default a third of ``platform_timeout``); at most half
            the platform timeout, so a live run never looks killed or stale.

    Raises:
        ConfigError: ``queue.stale_after <= platform_timeout`` ("the stale window is safe
            by construction"), duplicate stage types or quota names, a stage's
            ``max_attempts`` that conflicts with the queue's per-type setting, or a bad
            heartbeat interval.
        UnknownJobType: a stage's type is not among the queue's declared types.
    """

    def __init__(
        self,
        queue: Queue,
        stages: Sequence[Stage],
        *,
        quotas: Iterable[Quota | Allowance] = (),
        platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT,
        heartbeat_every: timedelta | None = None,
    ) -> None:
        if not isinstance(queue, Queue):
            raise InvalidInput("Pipeline needs a rota.Queue")
        self.queue = queue
        self.stages = tuple(stages)
        if not self.stages or not all(isinstance(s, Stage) for s in self.stages):
            raise InvalidInput("Pipeline needs a non-empty sequence of rota.Stage")
        self.platform_timeout = require_duration(platform_timeout, "platform_timeout")
        if queue.stale_after <= self.platform_timeout:
            raise ConfigError(
                f"the queue's stale window ({queue.stale_after}) must be longer than the "
                f"platform timeout ({self.platform_timeout}): otherwise a live run's jobs "
                f"look stale and are claimed twice")
        self.heartbeat_every = require_duration(
            heartbeat_every if heartbeat_every is not None else self.platform_timeout / 3,
            "heartbeat_every")
        if self.heartbeat_every * 2 > self.platform_timeout:
            raise ConfigError(f"heartbeat_every ({self.heartbeat_every}) must be at most "
                              f"half the platform timeout ({self.platform_timeout})")
        types = [queue.check_type(s.type) for s in self.stages]
        if len(set(types)) != len(types):
            raise ConfigError(f"duplicate stage types in {types}")
        self._quotas: dict[str, Quota | Allowance] = {}
        for q in [*(s.quota for s in self.stages if s.quota is not None), *quotas]:
            if not isinstance(q, Quota | Allowance):
                raise InvalidInput(f"quotas must be rota.Quota or rota.Allowance, got {q!r}")
            if self._quotas.setdefault(q.name, q) != q:
                raise ConfigError(f"two different quotas are named {q.name!r}")
        for s in self.stages:
            if s.concurrency >= queue.pool.max_size:
                # Handlers holding a connection while the runner needs one to settle
                # their jobs could wait on each other until the pool times out.
                log.warning("stage %r: concurrency %d is not below the pool's max_size "
                            "%d; handlers that hold a connection can starve the runner",
                            s.type, s.concurrency, queue.pool.max_size)
            if s.max_attempts is not None:
                current = queue.max_attempts_by_type.get(s.type)
                if current is not None and current != s.max_attempts:
                    raise ConfigError(
                        f"stage {s.type!r}: max_attempts {s.max_attempts} conflicts with "
                        f"the queue's max_attempts_by_type {current}")
                queue.max_attempts_by_type[s.type] = s.max_attempts
            if s.on_give_up is not None:
                queue.on_give_up(s.type, s.on_give_up)
            elif s.type not in queue.give_up_hooks:
                # The pipeline defines its types: no hook means none is owed, so the
                # give-up is recorded as handled instead of staying owed forever.
                queue.on_give_up(s.type, _no_give_up_hook)

    def quota(self, name: str) -> Quota | Allowance:
        """The quota or allowance called ``name``.

        Raises:
            ConfigError: no such quota was given to the pipeline.
        """
        try:
            return self._quotas[name]
        except KeyError:
            raise ConfigError(f"unknown quota {name!r}; known: "
                              f"{', '.join(sorted(self._quotas)) or 'none'}") from None

    async def run(
        self,
        trigger: Trigger = "cron",
        time_budget: timedelta = DEFAULT_TIME_BUDGET,
        *,
        maintenance: Maintainer | None = None,
    ) -> RunResult:
        """Run the pipeline once, inside ``time_budget`` (DESIGN: "The runner").

        The loop claims one batch from the first stage that has work (and is not
        blocked by its quota), runs it with the stage's concurrency, then starts again
        from the top. After the budget no batch is claimed; jobs in flight finish;
        claimed jobs not yet started are deferred back without burning an attempt. No
        database transaction is open while a handler runs. Jobs whose handlers return
        are completed in batches, and a batch's completions are written while the next
        batch is being claimed (the claim counts them as served either way: running
        and done jobs both count).

        The ``runs`` row is written when the run starts, saved after a batch at most
        once a second (``SAVE_EVERY_S``) and at every heartbeat, and completed at the
        end, also when the run ends in error.

        Args:
            trigger: ``cron``, ``cli``, ``worker`` or ``manual``.
            time_budget: wall-clock time for claiming, shorter than the platform timeout
                (default 220 s of 300 s; the gap is for finishing what is in flight).
            maintenance: run this first (for example a :class:`rota.Maintenance`); its
                counters land in the summary as ``maintenance.*``.

        Returns:
            The :class:`RunResult`. Errors of the run itself (the database refused a
            write, a bug) do not raise: they end the run with ``stop_reason="error"``
            and the error text. Handler errors are job failures, not run errors.

        Raises:
            InvalidInput: unknown trigger.
            ConfigError: ``time_budget`` not shorter than the platform timeout.
            psycopg.Error, psycopg_pool.PoolTimeout: the run's row could not be written
                at its start, or its end not within a few seconds of retrying (the
                database is down; maintenance later marks such a run "killed").
            asyncio.CancelledError: the run was cancelled; it is recorded as ended in
                error ("cancelled") when the database allows, its unstarted jobs are
                deferred and its jobs in flight failed (retried later).
        """
        if trigger not in TRIGGERS:
            raise InvalidInput(f"trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        require_duration(time_budget, "time_budget")
        if time_budget >= self.platform_timeout:
            raise ConfigError(f"time_budget ({time_budget}) must be shorter than the "
                              f"platform timeout ({self.platform_timeout})")
        run = _Run(uuid.uuid4(), trigger, time_budget)
        q = self.queue
        async with q.connection() as c:
            cur = await c.execute(q.sql("run_start"), {
                "id": run.id, "trigger": trigger, "offset": q.clock_offset})
            row = await cur.fetchone()
        assert row is not None
        started_at: datetime = row[0]
        heartbeat = asyncio.create_task(self._heartbeat(run))
        stop: StopReason
        error: str | None = None
        try:
            if maintenance is not None:
                for k, v in (await maintenance.run_once()).items():
                    run.add(f"maintenance.{k}", v)
            stop = await self._loop(run)
        except asyncio.CancelledError:
            await self._finish_quietly(run, "error", "cancelled")
            raise
        except Exception as exc:
            log.exception("run %s ended in error", run.id)
            stop, error = "error", _error_text(exc)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        finished_at = await self._save_end(run, stop, error)
        return RunResult(run.id, trigger, stop, run.jobs_done, run.jobs_failed,
                         run.jobs_deferred, run.quota_units, dict(run.summary), error,
                         started_at, finished_at)

    # -- the loop ----------------------------------------------------------------------

    async def _loop(self, run: _Run) -> StopReason:
        try:
            stop = await self._claim_and_run(run)
        except BaseException:
            if run.finishing is not None:  # let the last batch's completion land
                await asyncio.gather(run.finishing, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._release_prefetched(run)
            raise
        try:
            await self._finished(run)
        finally:
            await self._release_prefetched(run)
        return stop

    async def _claim_and_run(self, run: _Run) -> StopReason:
        while True:
            for i, stage in enumerate(self.stages):
                # After the budget no new batch is claimed.
                if run.out_of_time():
                    return "time_budget"
                if stage.type in run.skipped:
                    continue
                if stage.quota is not None:
                    block = await self._quota_block(stage.quota, stage.quota_cost)
                    if block is not None:
                        await self._skip(run, stage, block)
                        continue
                if run.prefetched is not None and run.prefetched[0] is stage:
                    task = run.prefetched[1]
                    run.prefetched = None
                    jobs = await task
                else:
                    jobs = await self.queue.claim(stage.type, stage.batch, run_id=run.id)
                # The previous batch's completion went on while this claim ran. If it
                # failed (or the run is cancelled here), this batch was never started:
                # hand it back untouched rather than leave it locked until stale.
                try:
                    await self._finished(run)
                except BaseException:
                    if jobs:
                        with contextlib.suppress(Exception):
                            await asyncio.shield(self.queue.release(jobs))
                    raise
                if not jobs:
                    continue
                if (stage.prefetch and stage.quota is None
                        and all(s.type in run.skipped for s in self.stages[:i])):
                    run.prefetched = (stage, asyncio.get_running_loop().create_task(
                        self.queue.claim(stage.type, stage.batch, run_id=run.id)))
                run.finishing = await self._run_batch(run, stage, jobs)
                if run.finishing is None:
                    await self._save_progress(run)
                break  # start again from the top: earlier stages win
            else:
                if run.blocked:
                    return ("quota_exhausted" if "exhausted" in run.blocked
                            else "quota_reserve")
                return "no_work"

    async def _release_prefetched(self, run: _Run) -> None:
        """Hand back a prefetched batch the run ends without starting.

        Raises:
            What the prefetching claim raised, or what releasing raised.
        """
        if run.prefetched is None:
            return
        task = run.prefetched[1]
        run.prefetched = None
        jobs = await task
        if jobs:
            n = await self.queue.release(jobs)
            run.add("prefetch_released", n)

    async def _finished(self, run: _Run) -> None:
        """Wait for the previous batch's completion (raising what it raised)."""
        task, run.finishing = run.finishing, None
        if task is not None:
            await task

    async def _quota_block(self, quota: Quota, cost: int) -> QuotaExhausted | None:
        usage = await quota.usage(self.queue)
        assert usage.remaining is not None
        reason = quota.blocked(usage.remaining, cost)
        if reason is None:
            return None
        return QuotaExhausted(quota.name, SHARED_SCOPE, usage.resets_at, reason,
                              usage.remaining)

    async def _skip(self, run: _Run, stage: Stage, block: QuotaExhausted) -> None:
        """Skip a quota-blocked stage for the rest of the run; its pending jobs, and its
        running jobs whose lock went stale (a dead run's, which no run would reclaim
        before the reset), wait for the reset as pending. Work left waiting for it makes
        the run's stop reason a quota one."""
        run.skipped.add(stage.type)
        q = self.queue
        async with q.connection() as c:
            # Pending jobs, and running jobs whose lock went stale (their run died),
            # wait for the reset: no run claims this stage before it.
            cur = await c.execute(q.sql("postpone"), {
                "type": stage.type, "until": block.resets_at, "offset": q.clock_offset,
                "stale_after": q.stale_after})
            if cur.rowcount > 0:
                run.add("postponed", cur.rowcount)
            cur = await c.execute(q.sql("quota_blocked_work"), {"type": stage.type,
                                                                "until": block.resets_at})
            row = await cur.fetchone()
        if row is not None and row[0]:
            run.blocked.add(block.reason)
        log.info("run %s: stage %r skipped: %s", run.id, stage.type, block)

    async def _run_batch(self, run: _Run, stage: Stage,
                         jobs: list[Job]) -> asyncio.Task[None] | None:
        """Run one claimed batch's handlers with the stage's concurrency.

        Returns:
            When every handler ran and none hit the stage's quota (the usual case):
            the task completing the jobs whose handlers returned and then saving the
            run's progress, which the loop awaits after its next claim, so that claim
            and this completion overlap. Otherwise None: everything settled here.
        """
        ctxs = [JobContext(j, self.queue, stage, run, self) for j in jobs]
        for ctx in ctxs:
            run.held[ctx.job.id] = ctx
        todo = deque(ctxs)
        blocked: list[QuotaExhausted] = []
        completer = _Completer(self.queue)
        handed_over = False
        try:
            if stage.batch_handler is not None:
                todo.clear()
                await self._call(stage.batch_handler(ctxs), ctxs, run, blocked, completer)
            else:
                handler = stage.handler
                assert handler is not None

                async def worker() -> None:
                    # After the budget, or once the stage's quota is gone, jobs not yet
                    # started stay in `todo` and are deferred back below.
                    while todo and not run.out_of_time() and not blocked:
                        ctx = todo.popleft()
                        await self._call(handler(ctx), [ctx], run, blocked, completer)

                async with asyncio.TaskGroup() as tg:
                    for _ in range(min(stage.concurrency, len(ctxs))):
                        tg.create_task(worker())
            if not blocked and not todo:
                handed_over = True
                return asyncio.get_running_loop().create_task(
                    self._complete_batch(run, ctxs, completer))
            await completer.wait()
        finally:
            if not handed_over:
                await completer.wait_quietly()
                await self._release(run, ctxs, blocked[0] if blocked else None)
        if blocked:
            await self._skip(run, stage, blocked[0])
        return None

    async def _complete_batch(self, run: _Run, ctxs: list[JobContext],
                              completer: _Completer) -> None:
        """Finish a batch whose handlers all ran: wait for its completions, hand back
        whatever is still unsettled (as _run_batch does inline), save the progress."""
        try:
            await completer.wait()
        finally:
            await completer.wait_quietly()
            await self._release(run, ctxs, None)
        await self._save_progress(run)

    async def _save_progress(self, run: _Run) -> None:
        """Save the run's counters after a batch, at most every ``SAVE_EVERY_S``."""
        if time.monotonic() - run.saved_at >= SAVE_EVERY_S:
            await self._save(run)

    async def _call(self, work: Awaitable[None], ctxs: list[JobContext], run: _Run,
                    blocked: list[QuotaExhausted], completer: _Completer) -> None:
        """Run one handler call and settle what it left unsettled (jobs it returned
        normally from are handed to ``completer``, which completes them in batches)."""
        for ctx in ctxs:
            ctx.started = True
        try:
            await work
        except DeferJob as exc:
            until = exc.until
            await _settle_all(ctxs, lambda c: c.defer(until))
        except QuotaExhausted as exc:
            if exc.scope_key == SHARED_SCOPE:
                blocked.append(exc)
            resets_at = exc.resets_at
            n = await _settle_all(ctxs, lambda c: c.defer(resets_at))
            run.add("quota_deferred", n)
        except Exception as exc:
            log.info("job(s) %s raised %s", [c.job.id for c in ctxs], _error_text(exc))
            error = exc
            await _settle_all(ctxs, lambda c: c.fail(error))
        else:
            completer.add([c for c in ctxs if not c.settled])

    async def _release(self, run: _Run, ctxs: list[JobContext],
                       blocked: QuotaExhausted | None) -> None:
        """Hand back what a batch still holds: jobs never started are deferred (no
        attempt burned): to the quota's reset when it is gone, else due now. Jobs
        started but unsettled (the run is ending in error or cancelled) are failed,
        so they are retried after backoff rather than waiting for the stale window."""
        unstarted = [c for c in ctxs if not c.settled and not c.started]
        if unstarted:
            until = blocked.resets_at if blocked is not None else None
            try:
                n = await self.queue.defer([c.job for c in unstarted], until)
            except Exception:
                log.exception("run %s: could not defer unstarted jobs", run.id)
            else:
                for c in unstarted:
                    c.outcome = "deferred"
                    run.held.pop(c.job.id, None)
                run.jobs_deferred += n
                if n < len(unstarted):  # reclaimed by another run meanwhile
                    run.add("lost", len(unstarted) - n)
                if blocked is not None:
                    run.add("quota_deferred", n)
        for c in ctxs:
            if not c.settled:
                try:
                    await c.fail("the run stopped while the job was running")
                except Exception:
                    log.exception("run %s: could not release job %s", run.id, c.job.id)

    # -- heartbeat and the runs row ----------------------------------------------------

    async def _heartbeat(self, run: _Run) -> None:
        """Refresh the locks of the jobs this run holds and save its progress, every
        ``heartbeat_every`` (well inside the stale window and the platform timeout)."""
        q = self.queue
        while True:
            await asyncio.sleep(self.heartbeat_every.total_seconds())
            try:
                held = [c.job for c in list(run.held.values())]
                if run.prefetched is not None and run.prefetched[1].done() \
                        and not run.prefetched[1].cancelled() \
                        and run.prefetched[1].exception() is None:
                    held += run.prefetched[1].result()
                if held:
                    async with q.connection() as c:
                        await c.execute(q.sql("heartbeat"), {
                            "ids": [j.id for j in held],
                            "claim_tokens": [j.claim_token for j in held],
                            "offset": q.clock_offset})
                await self._save(run)
            except Exception:
                log.exception("run %s: heartbeat failed", run.id)

    async def _save(self, run: _Run, *, final: bool = False,
                    stop_reason: StopReason | None = None,
                    error: str | None = None) -> datetime | None:
        """Save the run's counters (``final``: and its end); returns ``finished_at``."""
        q = self.queue
        run.saved_at = time.monotonic()
        async with q.connection() as c:
            cur = await c.execute(q.sql("run_save"), {
                **run.save_params(), "final": final, "stop_reason": stop_reason,
                "error": error, "offset": q.clock_offset})
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def _save_end(self, run: _Run, stop: StopReason, error: str | None) -> datetime:
        """Record the run's end, retrying for a few seconds when the connection fails.

        A run cut off by a database restart ends in error, and the first statement after
        it may run on another connection the restart killed (or find the server still
        starting): the run records how it ended as soon as the database answers again,
        rather than raising and leaving its row to be marked "killed" later.

        Raises:
            psycopg.OperationalError: the database stayed unreachable.
        """
        for delay in (*_END_RETRY_DELAYS, None):
            try:
                finished_at = await self._save(run, final=True, stop_reason=stop,
                                               error=error)
            except psycopg.OperationalError:
                if delay is None:
                    raise
                log.warning("run %s: could not record its end yet; retrying", run.id)
                await asyncio.sleep(delay)
            else:
                assert finished_at is not None, "the run's row disappeared"
                return finished_at
        raise AssertionError("unreachable")

    async def _finish_quietly(self, run: _Run, stop: StopReason, error: str) -> None:
        try:
            await self._save(run, final=True, stop_reason=stop, error=error)
        except Exception:
            log.exception("run %s: could not record its end", run.id)


async def _no_give_up_hook(job: Job, conn: AnyConn) -> None:
    """The give-up hook of a stage that declares none."""


class _Completer:
    """Completes the jobs whose handlers returned normally, in batches: one
    ``complete_many`` statement for whatever has finished since the previous one was
    sent (group commit). A lone job is completed at once, as before; jobs that finish
    while a statement is in flight go together in the next one, so a batch of fast
    handlers costs one or two statements instead of one per job."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.pending: list[JobContext] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, ctxs: list[JobContext]) -> None:
        if not ctxs:
            return
        self.pending.extend(ctxs)
        if self.task is None or self.task.done():
            if self.task is not None and (self.task.cancelled()
                                          or self.task.exception() is not None):
                return  # a failed flush: wait() raises it; these stay unsettled
            self.task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            oks = await self.queue.complete_many([c.job for c in batch])
            for c, ok in zip(batch, oks, strict=True):
                c._settle("done" if ok else "lost")

    async def wait(self) -> None:
        """Wait until every job handed over is completed (or found lost).

        Raises:
            Whatever completing raised (the jobs not completed stay unsettled).
        """
        while self.task is not None:
            task = self.task
            await task
            if task is self.task and not self.pending:
                return
            if task is self.task:  # added after the task ended
                self.task = asyncio.get_running_loop().create_task(self._flush())

    async def wait_quietly(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


async def _settle_all(ctxs: list[JobContext],
                      settle: Callable[[JobContext], Awaitable[object]]) -> int:
    n = 0
    for ctx in ctxs:
        if not ctx.settled:
            await settle(ctx)
            n += 1
    return n


def _error_text(exc: BaseException) -> str:
    """One error as storable text (a NUL or a lone surrogate in an exception's message
    would make the runs row unwritable)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return storable_text(f"{type(exc).__name__}: {exc}")


def _check_int(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(f"{name} must be an int >= 1, got {value!r}")


__all__ = [
    "DEFAULT_PLATFORM_TIMEOUT",
    "DEFAULT_TIME_BUDGET",
    "STOP_REASONS",
    "TRIGGERS",
    "BatchHandler",
    "Handler",
    "JobContext",
    "Maintainer",
    "Pipeline",
    "RunResult",
    "Stage",
    "StopReason",
    "Trigger",
]

"""What a handler gets (:class:`JobContext`) and one run's mutable state
(:class:`RunState`) (docs/design.md, "The runner")."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from ..checks import require_text
from ..errors import InvalidInput
from ..job import DeferJob, FailOutcome, Job
from ..queue import AnyConn, Queue
from ..quota import Allowance, Quota
from .stage import Outcome, Stage

if TYPE_CHECKING:
    from .pipeline import Pipeline


class RunState:
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

    def __init__(self, job: Job, queue: Queue, stage: Stage, run: RunState,
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


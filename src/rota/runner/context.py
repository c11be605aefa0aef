"""What a handler gets (:class:`JobContext`) and one run's mutable state
(:class:`RunState`) (docs/design.md, "The runner").

This module imports nothing else of the runner: the stage, the loop, the batch runner
and the recorder all build on it, so the runner's import graph has no cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import math
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, NoReturn, Protocol, TypeVar

from psycopg_pool import PoolTimeout

from .. import tracing
from ..checks import INT_MAX, require_text, storable_text
from ..cost import MAX_COST, charge_units, job_cost
from ..errors import ConfigError, HandlerTimedOut, InvalidCharge, InvalidInput
from ..job import DeferJob, FailOutcome, Job
from ..queue import AnyConn, Queue
from ..quota import Allowance, Quota
from ..rates import NO_KEY, Grant, RateLimit, RateLimited, RateLimitUnreachable
from ..results import ResultError, encode_result

log = logging.getLogger("rota.runner")
T = TypeVar("T")

# A counter saturates here instead of growing into a value JSON or jsonb cannot hold
# (an int past 4,300 digits, a float past 1.8e308).
_COUNTER_MAX = float(sys.float_info.max)
_INT_COUNTER_MAX = 2**63 - 1

#: How a claimed job left a run: completed, failed for a retry or for good, deferred,
#: handed back as it was, or lost to another claim.
Outcome = Literal["done", "retry", "failed", "deferred", "released", "lost"]


class StageInfo(Protocol):
    """The stage running a job as a :class:`JobContext` shows it (a
    :class:`rota.Stage`; typed by this protocol so that this module need not import the
    stage's, which imports this one for its handler types)."""

    @property
    def type(self) -> str:
        """The job type the stage claims."""
        ...


#: Finds a quota or allowance by name (``Pipeline.quota``): what ``ctx.spend("name")``
#: resolves its name with. Raises ``ConfigError`` for an unknown name.
QuotaLookup = Callable[[str], "Quota | Allowance"]
#: Resolves a rate limit named in ``ctx.take("name")`` (``Pipeline.rate_limit``).
RateLookup = Callable[[str], RateLimit]


class RunState:
    """One run's mutable state: counters, the claims it holds, skipped stages, and its
    two deadlines on the event loop's clock: ``deadline`` (the budget: no claim after
    it) and ``hard_deadline`` (every handler is cut by then, so the run ends before
    the platform timeout: docs/design.md, "Handler deadlines")."""

    def __init__(self, run_id: uuid.UUID, trigger: str, budget: timedelta,
                 hard_limit: timedelta | None = None,
                 stop: asyncio.Event | None = None,
                 platform_limit: timedelta | None = None) -> None:
        self.id = run_id
        self.trigger = trigger
        now = time.monotonic()
        self.started_at = now
        self.deadline = now + budget.total_seconds()
        self.hard_deadline = now + (hard_limit or budget).total_seconds()
        # The platform timeout from the run's start: how long a hard stop waits for
        # sync handlers still running in threads (docs/design.md, "Handler deadlines").
        self.platform_deadline = now + (platform_limit or hard_limit or budget).total_seconds()
        self.stop = stop
        # The run itself was cancelled (a second stop request, or its caller): sync
        # handlers' threads are waited for until the platform deadline, not longer.
        self.cancelled = False
        self.ended = False  # the end is recorded: nothing else saves the row
        self.jobs_done = 0
        self.jobs_failed = 0
        self.jobs_deferred = 0
        self.quota_units = 0
        self.summary: dict[str, int | float] = {}
        self.held: dict[int, JobContext] = {}       # claimed and not yet settled
        self.skipped: set[str] = set()               # stage types blocked by quota
        self.blocked: set[str] = set()               # reasons with quota-blocked work
        # Stage types waiting for their rate limits' units: (monotonic time to look
        # again, the queue-clock instant the units are there) (docs/design.md, "Rates").
        self.rate_waits: dict[str, tuple[float, datetime]] = {}
        self.finishing: asyncio.Task[None] | None = None  # last batch's completion
        # The next batch claimed ahead: the stage type it is for, and its claim.
        self.prefetched: tuple[str, asyncio.Task[list[Job]]] | None = None
        self.saved_at = -1e9  # monotonic time of the last save of the runs row
        self.trace = tracing.RunTrace(None)  # the run's span (rota.tracing)
        # Jobs whose due time this run pushed to its budget's end, so it never claims
        # them again: (id, the claim token left on the row, the pushed due time, the
        # due time asked for, None: at once). When the run ends sooner, each is due as
        # asked again (docs/design.md, "Defer").
        self.pushed: list[tuple[int, uuid.UUID | None, datetime, datetime | None]] = []

    def time_left(self) -> float:
        """Seconds left in the budget (0 once it is spent or a stop was asked for)."""
        if self.stop is not None and self.stop.is_set():
            return 0.0
        return max(self.deadline - time.monotonic(), 0.0)

    def out_of_time(self) -> bool:
        """Whether no more batches may be claimed: the budget is spent, or the run was
        asked to stop (a worker's SIGTERM)."""
        return (time.monotonic() >= self.deadline
                or (self.stop is not None and self.stop.is_set()))

    def stopping(self) -> bool:
        """Whether the run was asked to stop (its ``stop`` event is set: a signal to
        its process): it then stops ``interrupted`` (docs/design.md, "The runner")."""
        return self.stop is not None and self.stop.is_set()

    def past_hard_deadline(self) -> bool:
        return time.monotonic() >= self.hard_deadline

    def threads(self) -> list[JobContext]:
        """The held jobs whose sync handler is still running in its thread (not left
        behind by a hard stop): they are never handed back, failed or let go stale while
        this process lives (docs/design.md, "Handler deadlines")."""
        return [c for c in list(self.held.values()) if c.in_thread and not c.abandoned]

    async def threads_returned(self) -> None:
        """Wait until no held job's thread is running."""
        while (running := self.threads()):
            await asyncio.wait({c.thread for c in running if c.thread is not None})

    def add(self, name: str, n: int | float = 1) -> None:
        """Add to a summary counter, saturating (see :func:`saturated`)."""
        self.summary[name] = saturated(self.summary.get(name, 0) + n)

    def save_params(self) -> dict[str, Any]:
        """The runs row's values as the statement takes them. Whatever a handler
        counted, they are storable: integer columns capped at their ceiling, the
        summary's names made valid text and its numbers finite (docs/design.md, "Bad
        data belongs to its job": a counter must not leave the run unfinished)."""
        summary = {storable_text(str(k)): saturated(v) for k, v in self.summary.items()}
        return {"id": self.id, "jobs_done": min(self.jobs_done, INT_MAX),
                "jobs_failed": min(self.jobs_failed, INT_MAX),
                "jobs_deferred": min(self.jobs_deferred, INT_MAX),
                "quota_units": min(self.quota_units, INT_MAX),
                "summary": json.dumps(summary, sort_keys=True, allow_nan=False)}


def saturated(value: int | float) -> int | float:
    """A counter's value kept storable in the runs row's jsonb: ints within ±(2**63-1),
    floats finite (an overflow to infinity stops at the largest float; NaN, which only
    infinities make, counts as 0)."""
    if isinstance(value, int):
        return max(-_INT_COUNTER_MAX, min(value, _INT_COUNTER_MAX))
    if math.isnan(value):
        return 0.0
    return max(-_COUNTER_MAX, min(value, _COUNTER_MAX))


class Settles(Protocol):
    """What settles a job when its handler asks (``ctx.complete``, ``ctx.fail``,
    ``ctx.defer``): the runner's :class:`~rota.runner.settle.Settler`, the one path
    that settles a job (typed here by this protocol so that this module need not import
    the settler's, which imports this one)."""

    async def complete(self, ctx: JobContext, *, result: Any = None,
                       conn: AnyConn | None = None) -> bool:
        """Complete the job now (see :meth:`JobContext.complete`)."""
        ...

    async def fail(self, ctx: JobContext, error: BaseException | str, *,
                   give_up: bool = False) -> FailOutcome:
        """Record a failed attempt now (see :meth:`JobContext.fail`)."""
        ...

    async def defer(self, ctx: JobContext,
                    until: datetime | timedelta | None = None) -> bool:
        """Defer the job (see :meth:`JobContext.defer`)."""
        ...


class JobContext:
    """What a handler gets for one claimed job.

    Attributes:
        job: the claimed :class:`rota.Job` (``attempts`` already counts this attempt).
        queue: the pipeline's :class:`rota.Queue` (``Pipeline.queue``): enqueue
            follow-up jobs through it and their stage's ``max_attempts`` applies.
        run_id: the run's id (``runs.id``).
        stage: the :class:`Stage` running it.

    Args:
        job, queue, stage: as above.
        run: the run's state (counters, budget).
        quotas: resolves a quota name given to :meth:`spend` or :meth:`exhaust`
            (``Pipeline.quota``).
        rate_limits: resolves a rate limit name given to :meth:`take` or
            :meth:`backoff` (``Pipeline.rate_limit``).
        settler: settles the job when the handler asks (the run's
            :class:`~rota.runner.settle.Settler`); without one, :meth:`complete`,
            :meth:`fail` and :meth:`defer` raise ``InvalidInput``.
    """

    def __init__(self, job: Job, queue: Queue, stage: StageInfo, run: RunState,
                 quotas: QuotaLookup, rate_limits: RateLookup | None = None, *,
                 settler: Settles | None = None) -> None:
        self.job = job
        self._settler = settler
        self.queue = queue
        self.stage = stage
        self.run_id = run.id
        self._run = run
        self._quotas = quotas
        self._rate_limits = rate_limits
        self.started = False
        self.outcome: Outcome | None = None
        #: When the handler must be done (event loop clock); None until it starts.
        self.deadline: float | None = None
        #: Completed on the handler's own connection: done only once that commits.
        self.in_caller_tx = False
        #: The handler could not get a connection from rota's pool (not its failure).
        self.pool_timed_out = False
        #: Units of the stage's rate limits taken for this job, by limit name: when
        #: they were the job's (docs/design.md, "Rates").
        self.rate_grants: dict[str, Grant] = {}
        #: Units of each rate limit this attempt holds, before the fact (the stage's and
        #: the handler's takes): (when they were the job's, units), by limit name.
        self.rate_taken: dict[str, list[tuple[datetime, int]]] = {}
        #: The job's result, stored when the runner completes it (docs/design.md,
        #: "Results"): a handler's return value lands here; a batch handler sets it.
        self.result: Any = None
        #: The span of this handler run (an OpenTelemetry span, or None without
        #: tracing): a batch handler may make it current (``rota.tracing.current``) to
        #: enqueue under this job's trace (docs/operations.md, "Traces").
        self.span: Any = None
        #: The outcome of the sync call :meth:`to_thread` runs, while and after it runs.
        self.thread: asyncio.Future[Any] | None = None
        self._thread: threading.Thread | None = None
        #: Set when the handler's timeout passed while its thread ran: (the timeout in
        #: seconds, where the thread was then).
        self.overdue: tuple[float, str] | None = None
        #: A hard stop left its thread running past the platform timeout: the job is
        #: left as it is, to the stale-lock rules (docs/design.md, "Stale locks").
        self.abandoned = False
        #: Units charged with :meth:`charge`, summed (docs/design.md, "Cost").
        self.charged = Decimal(0)
        self._charges = 0
        #: When its handler started (event loop clock) and, for a batch handler, how
        #: many jobs share the call: a stage charging "seconds" divides the call's run
        #: time evenly among them.
        self.started_mono: float | None = None
        self.call_size = 1
        #: The handler's run time in seconds (this job's share of the call), set by the
        #: runner when the call ended; ``None`` before that.
        self.seconds: float | None = None

    @property
    def settled(self) -> bool:
        """Whether the job was completed, failed or deferred (or found lost)."""
        return self.outcome is not None

    @property
    def in_thread(self) -> bool:
        """Whether a sync call started by :meth:`to_thread` is still running."""
        return self.thread is not None and not self.thread.done()

    async def to_thread(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run the sync ``func(*args, **kwargs)`` in a thread of its own and return what
        it returns (or raise what it raises). A thread cannot be cancelled, so while it
        runs its job is never handed back, retried or let go stale by this process
        (docs/design.md, "Handler deadlines"): its heartbeat goes on; past the
        handler's timeout the job is marked overdue (logged, counted ``overdue``) and,
        once the thread returns, this raises :class:`rota.HandlerTimedOut` (the job
        fails and is retried with backoff); a run's end or a first stop waits for it;
        a hard stop (a second signal) waits for it until the run's platform timeout,
        then leaves the job as it is, to the stale-lock rules. The thread is a daemon:
        a process that exits does not wait for it. ``rota.Stage`` runs a ``def``
        handler through this.

        Raises:
            rota.HandlerTimedOut: ``func`` returned (or raised: its cause) after the
                handler's timeout.
            InvalidInput: a call of this job is already running in a thread.
            asyncio.CancelledError: a hard stop left the thread behind.
        """
        if self.in_thread:
            raise InvalidInput(f"job {self.job.id}: a sync call is already running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()

        def settle(error: BaseException | None, value: Any) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def target() -> None:
            error: BaseException | None = None
            value: Any = None
            try:
                value = context.run(func, *args, **kwargs)
            except Exception as exc:
                error = exc
            except BaseException as exc:  # SystemExit in a thread: the call failed
                error = RuntimeError(f"the sync call raised {exc!r}")
            try:
                loop.call_soon_threadsafe(settle, error, value)
            except RuntimeError:  # the event loop is closed: the process is exiting
                pass

        started = time.monotonic()
        self.thread = future
        self._thread = threading.Thread(target=target, daemon=True,
                                        name=f"rota-job-{self.job.id}")
        self._thread.start()
        await self._outlast(future)
        if self.overdue is not None:
            limit, where = self.overdue
            cause = future.exception()
            timed_out = HandlerTimedOut(
                f"the sync handler ran {time.monotonic() - started:.1f} s, past its "
                f"{limit:g} s timeout (a thread cannot be cancelled)")
            timed_out.add_note(f"where the thread was at the timeout:\n{where}")
            raise timed_out from cause
        return future.result()

    async def _outlast(self, future: asyncio.Future[Any]) -> None:
        """Wait until the thread's ``future`` is done, whatever cancels the caller
        meanwhile: a run's end or an error elsewhere in the batch waits for it; a hard
        stop (the run's ``stop`` is set, or the run itself cancelled) waits until the
        run's platform deadline and then leaves the job behind (:attr:`abandoned`) and
        lets the cancellation through."""
        task = asyncio.current_task()
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                if future.done():
                    break
                if self._run.stopping() or self._run.cancelled:
                    left = self._run.platform_deadline - time.monotonic()
                    if left > 0:
                        log.warning("job %s: stopping; waiting up to %.0f s for its sync "
                                    "handler, still running in a thread", self.job.id, left)
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait({future}, timeout=left)
                    if not future.done():
                        self.abandoned = True
                        log.error("job %s: its sync handler is still running at the "
                                  "platform timeout; left to the stale-lock rules",
                                  self.job.id)
                        raise
                if task is not None:
                    task.uncancel()  # a thread cannot be cancelled: wait for it

    def mark_overdue(self, limit: float) -> None:
        """The handler's timeout (``limit`` seconds) passed while its thread runs: log
        it, count it (``overdue``), and keep where the thread is for the error it gets
        once it returns (docs/design.md, "Handler deadlines")."""
        if self.overdue is not None:
            return
        where = "(unknown)"
        thread = self._thread
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        if frame is not None:
            where = "".join(traceback.format_stack(frame))
        self.overdue = (limit, where)
        self._run.add("overdue")
        log.warning("job %s: overdue: its sync handler is still running in a thread past "
                    "its %g s timeout; it fails once the thread returns", self.job.id, limit)

    def time_left(self) -> timedelta:
        """Time left in the run's budget (never negative). A handler with long work
        ahead may raise ``DeferJob`` when it is short."""
        return timedelta(seconds=self._run.time_left())

    def count(self, name: str, n: int | float = 1) -> None:
        """Add ``n`` to the run summary's counter ``name`` (``"drafts_written"``,
        ``"tokens"``…), saved in the ``runs`` row.

        Counters saturate (an int at ±(2**63-1), a float at the largest finite float)
        rather than grow past what the runs row can store.

        Raises:
            InvalidInput: an empty, over-long (512 UTF-8 bytes) or unstorable name (NUL,
                lone surrogate), or ``n`` not a finite int/float.
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
        connections are shared by all jobs in flight.

        When none can be had in the pool's timeout, ``psycopg_pool.PoolTimeout`` is
        raised; let it propagate: the runner hands the job back as it was (no attempt
        burned), since a missing connection is rota's failure, not the job's
        (docs/design.md, "Connections")."""
        try:
            cm = self.queue.connection()
            conn = await cm.__aenter__()
        except PoolTimeout:
            self.pool_timed_out = True
            raise
        try:
            yield conn
        except BaseException as exc:
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await cm.__aexit__(None, None, None)

    @tracing.spend_traced
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
        q = self._quotas(quota) if isinstance(quota, str) else quota
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
        q = self._quotas(quota) if isinstance(quota, str) else quota
        if isinstance(q, Quota):
            raise await q.exhaust(self.queue)
        exc = await q.exhaust(self.queue, self.job.group_id)
        if exc is None:
            raise DeferJob(None, f"allowance {q.name!r} reported exhausted")
        raise exc

    async def take(self, limit: RateLimit | str, units: int = 1, *,
                   after: bool = False) -> Grant:
        """Take ``units`` of a rate limit for this job (its bucket is the limit's key
        of this job), atomically in the database, shared by every worker
        (docs/design.md, "Rates"). Before the fact, it waits for units reserved within
        the limit's ``max_wait``; when they are further away,
        :class:`~rota.rates.RateLimited` is raised: let it propagate and the runner
        defers the job to the moment they will be there (no attempt burned).

        Args:
            limit: a :class:`RateLimit`, or the name of one the pipeline knows.
            units: int > 0 (at most the limit's ``burst`` unless ``after``).
            after: spend units already used (a model's tokens, known once it answered):
                granted at once, the bucket may go below zero and later takers wait.

        Returns:
            The :class:`~rota.rates.Grant` (already waited for). A keyed limit whose key
            is ``None`` for this job takes nothing and returns a zero wait.

        Raises:
            RateLimited: no units within ``max_wait`` (nothing taken).
            ConfigError: an unknown limit name.
            InvalidInput: bad units, or more than ``burst`` before the fact.
        """
        lim = self._rate_limit(limit)
        key = lim.key_for(self.job)
        if key is None:
            return Grant(await self.queue.now(), timedelta(0))
        try:
            grant = await lim.take(self.queue, units, key=key, after=after)
        except RateLimited:
            await self._refused_by_own_units(lim, units)
            raise
        if not after:
            self.rate_taken.setdefault(lim.name, []).append((grant.at, units))
        if grant.wait > timedelta(0):
            await asyncio.sleep(grant.wait.total_seconds())
        self._run.add(f"rate.{lim.name}", units)
        return grant

    async def _refused_by_own_units(self, lim: RateLimit, units: int) -> None:
        """After a refused take: raise :class:`~rota.rates.RateLimitUnreachable` when
        this job's own units of ``lim`` from this attempt alone keep the ``units`` asked
        for further away than ``max_wait``. The bucket gives at most ``burst`` at once
        and one more every emission interval, so once the job holds ``k`` units, ``n``
        more are its at the earliest ``(k + n - burst)`` intervals after its first;
        every attempt takes those ``k`` again, so deferring it would repeat forever
        (docs/design.md, "Rates")."""
        own = self.rate_taken.get(lim.name, [])
        held = sum(n for _, n in own)
        if not own or held + units <= lim.burst:
            return
        first = min(at for at, _ in own)
        own_free_at = first + lim.emission * (held + units - lim.burst)
        wait = own_free_at - await self.queue.now()
        if wait <= lim.max_wait:
            return
        self._run.add(f"rate.{lim.name}.unreachable")
        stage = self.stage.type
        message = (
            f"rate limit {lim.name!r} in stage {stage!r}: this job already holds {held} "
            f"unit(s) of it from this attempt and asks {units} more; with burst "
            f"{lim.burst} they come {wait.total_seconds():g} s later at the earliest, past "
            f"max_wait {lim.max_wait.total_seconds():g} s, so this take can never be "
            f"granted (each attempt would take its units again and be deferred). Take all "
            f"of a job's units at once (burst >= {held + units}), or raise max_wait "
            f"(docs/design.md, \"Rates\")")
        log.warning("job %s: %s", self.job.id, message)
        raise RateLimitUnreachable(message, lim.name, stage)

    async def backoff(self, limit: RateLimit | str, wait: timedelta | float) -> NoReturn:
        """The provider answered HTTP 429 with ``Retry-After: wait``: hold every worker
        off ``limit`` (this job's bucket of it) until then, and raise
        :class:`~rota.rates.RateLimited` so the runner defers this job to the end of the
        backoff (no attempt burned) (docs/design.md, "Rates"). Like ``ctx.exhaust``, it
        never returns; to hold the others off and carry on, call
        :meth:`rota.RateLimit.backoff` instead.

        Args:
            limit: a :class:`RateLimit`, or the name of one the pipeline knows.
            wait: a positive ``timedelta`` or seconds (the Retry-After header's value).

        Raises:
            RateLimited: always, with ``free_at`` the backoff's end.
            InvalidInput: ``wait`` is not a positive duration.
        """
        lim = self._rate_limit(limit)
        key = lim.key_for(self.job)
        key = NO_KEY if key is None else key
        until = await lim.backoff(self.queue, wait, key=key)
        self._run.add(f"rate.{lim.name}.backoffs")
        raise RateLimited(lim.name, key, 1, until)

    def _rate_limit(self, limit: RateLimit | str) -> RateLimit:
        if not isinstance(limit, str):
            return limit
        if self._rate_limits is None:
            raise ConfigError(f"unknown rate limit {limit!r}: no rate limit is named here")
        return self._rate_limits(limit)

    def charge(self, units: Decimal | float | int) -> None:
        """Charge the job ``units`` of cost (docs/design.md, "Cost"): what it counts in
        its group's and owner's served counts once it completes, instead of 1. Several
        charges add up; for a stage with ``cost="seconds"`` they add to its run time.
        Call it from a sync handler's thread too.

        Args:
            units: a positive finite number (an int, float or Decimal; not a bool), the
                job's charges summed at most :data:`rota.cost.MAX_COST`. Costs keep 6
                decimal places.

        Raises:
            InvalidCharge: ``units`` is not such a number, the job's charges would add
                up past the limit, or the job is already settled (completed by
                :meth:`complete`, failed or deferred: the charge would be lost):
                nothing is charged; uncaught, the attempt fails like any handler error
                (never the run).
        """
        value = charge_units(units)
        if self.settled or self.in_caller_tx:
            raise InvalidCharge(f"job {self.job.id} is already settled: a charge after "
                                f"ctx.complete() would be lost (charge before it)")
        job_cost(self.charged + value)  # refuses a total past the limit
        self.charged += value
        self._charges += 1

    @property
    def cost(self) -> Decimal | None:
        """What completing the job charges (docs/design.md, "Cost"): for a stage with
        ``cost="seconds"``, its run time in seconds (so far, if it has not ended) plus
        what it charged, at most :data:`rota.cost.MAX_COST` (the measured part is not
        the handler's to check); else what it charged, or ``None`` (1) when it charged
        nothing. Rounded to 6 places. Never raises: every charge was checked when
        made."""
        if getattr(self.stage, "cost", "units") == "seconds" and (
                self.seconds is not None or self.started_mono is not None):
            seconds = self.seconds
            if seconds is None:
                assert self.started_mono is not None
                seconds = (asyncio.get_running_loop().time() - self.started_mono) \
                    / self.call_size
            return job_cost(min(Decimal(seconds) + self.charged, Decimal(MAX_COST)))
        return job_cost(self.charged) if self._charges else None

    async def complete(self, *, result: Any = None, conn: AnyConn | None = None) -> bool:
        """Mark the job done now (the runner does it when the handler returns).

        Args:
            result: the value stored as the job's result (see
                :meth:`rota.Queue.complete`); ``None`` for none.
            conn: complete inside the handler's own transaction, so the job is done
                if and only if the handler's writes commit. The run counts it done only
                once the handler has returned and the runner has read it done under
                this claim; if that transaction did not commit (a deferred constraint
                failed at COMMIT, a rollback), the job fails with the error the handler
                raised (or "the transaction that completed the job did not commit"), and
                retries with backoff (docs/design.md, "Counters show what committed").

        Returns:
            ``False`` when this run lost the job (reclaimed after a stale lock); with
            ``conn``, ``True`` means the statement matched in that transaction.

        Raises:
            ResultError: ``result`` cannot be stored; the job failed with that error
                (see :meth:`rota.Queue.complete`).
        """
        self._check_unsettled()
        try:
            encode_result(result, self.queue.max_payload_bytes)
        except ResultError as exc:
            await self.fail(exc, give_up=True)
            raise
        return await self._settles().complete(self, result=result, conn=conn)

    async def fail(self, error: BaseException | str, *, give_up: bool = False) -> FailOutcome:
        """Record a failed attempt now (retry with backoff, or failed with give-up
        hook; ``give_up``: failed whatever the attempts left); see
        :meth:`rota.Queue.fail`."""
        self._check_unsettled()
        return await self._settles().fail(self, error, give_up=give_up)

    async def defer(self, until: datetime | timedelta | None = None) -> bool:
        """Put the job back without burning an attempt, due at ``until`` (an aware
        instant; a ``timedelta`` from the queue's clock now; ``None``: as soon as
        possible); see :meth:`rota.Queue.defer`. A run never runs a job it deferred: a
        time before the run's budget ends becomes the end of the budget, and when the
        run ends sooner the job is due at ``until`` again (docs/design.md, "Defer").

        Returns:
            ``False`` when this run lost the job, or it gave up on its deferral cap.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
            InvalidInput: ``until`` is out of range, a negative ``timedelta`` or one
                longer than 1000 years, or neither a datetime nor a timedelta (as
                :meth:`rota.Queue.defer`); the job is already settled.
        """
        self._check_unsettled()
        return await self._settles().defer(self, until)

    def _check_unsettled(self) -> None:
        if self.outcome is not None:
            raise InvalidInput(f"job {self.job.id} is already settled ({self.outcome})")
        if self.in_caller_tx:
            raise InvalidInput(f"job {self.job.id} is already completed in the handler's "
                               f"transaction")

    def _settles(self) -> Settles:
        if self._settler is None:
            raise InvalidInput(f"job {self.job.id}: this JobContext was not made by a "
                               f"runner, so it cannot settle its job")
        return self._settler

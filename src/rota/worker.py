"""A long-running worker (docs/design.md, "Ways to run it"): runs the pipeline back to
back while there is work, sleeps until the next job is due, and wakes within a second when a job is
enqueued.

Waking has two paths, so neither is a single point of failure:

* LISTEN/NOTIFY: a statement trigger on ``jobs`` (the schema's ``notify_jobs_inserted``)
  makes every INSERT notify a channel named
  exactly like the queue's schema; the worker keeps one connection listening on it and
  reconnects (with backoff) when it drops, for example across a database restart, or
  when it stops answering while staying open (a check every ``keepalive`` with a
  ``liveness_timeout``: docs/operations.md, "A database that stops answering").
  When the listening connection first comes up, the worker checks that notifications
  reach it (a notification of its own, sent through the queue's pool): through a
  transaction pooler they do not, and without ``listen_url`` (a direct connection:
  :class:`rota.Queue`) it says so once and polls every ``fallback_poll`` instead
  (docs/operations.md, "Poolers and failover").
* Polling: the worker never sleeps longer than ``idle_poll`` without asking the database
  when the next job is due, which also catches what no INSERT announces (a job retried by
  UPDATE, a stale lock becoming reclaimable, a group unpaused, a notification missed
  while the listening connection was down).

Each wake-up asks the database first (``sql/next_due.sql``) and only starts a run when
something is due, so an idle worker writes no ``runs`` rows. A pipeline's schedules
count as due at their next tick (:meth:`rota.schedule.Scheduler.due_in`), so the sleep
ends in time for it and the run that starts then enqueues it. A notification is only a
hint to look: any role connected to the database may send one on any channel, so its
payload is ignored. A notification starts a look at once, unless the last look a
notification caused found nothing to run: then it waits until ``wake_interval`` after
that look. So an enqueue is started within a round trip or two, while a flood of
notifications with nothing due costs one ``next_due`` query per interval, not one each
(docs/operations.md, "Security" and "Notifications").

One piece (about 700 lines): :class:`Worker`'s loop, its wake-ups (the listening
connection and its notification check, the poll, the killed-run wake-up) and its
rescue and maintenance turns all decide one thing, when the next look happens, and
share its state (the stop event, the last look, the backoff); the helpers at the end
are the loop's own waits. Split, each part would take the loop's state as arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from . import statements
from .checks import require_duration
from .errors import InvalidInput, RotaError, first_line
from .maintenance import Maintainer, Maintenance, Rescue, check_pipeline_maintenance
from .queue import Queue
from .runner.source import (
    PipelineSource,
    check_time_budget,
    pipeline_queue,
    resolve_pipeline,
)
from .schedule import Scheduler
from .settings import DEFAULT_PLATFORM_TIMEOUT, DEFAULT_TIME_BUDGET, default_time_budget
from .store import MISSING

log = logging.getLogger("rota.worker")
T = TypeVar("T")

#: How often the worker fails stuck jobs between daily maintenance runs.
DEFAULT_RESCUE_EVERY = timedelta(minutes=1)

#: How long the worker's own statements (the listening connection's check, the look at
#: when the next job is due) may wait for an answer (docs/operations.md, "Network
#: partitions and timeouts").
LIVENESS_TIMEOUT = timedelta(seconds=5)

#: How long the worker's check that notifications arrive waits for its own.
PROBE_WAIT = timedelta(seconds=1)

#: The channel of that check (its payload a token of the worker's own).
PROBE_CHANNEL = "rota_probe"

#: Errors that no retry fixes: rota's schema, or a table or function of it, is missing
#: (``rota migrate``), or the queue's groups relation is.
_FATAL_DB_ERRORS = MISSING


class Worker:
    """Run a pipeline until told to stop.

    Args:
        pipeline: a pipeline (``async run(*, trigger, time_budget)``, and normally a
            ``queue`` attribute and ``stages`` with a ``type`` each) or a zero-argument
            factory of one, resolved once when :meth:`run_forever` starts.
        queue: the queue to listen on and to ask when the next job is due; default the
            pipeline's ``queue`` attribute.
        idle_poll: the longest sleep without asking the database (the polling fallback).
        time_budget: each run's budget; a worker's runs end at it and the next one starts
            at once, so ``runs`` rows stay bounded in time. Default 11/15 of the
            pipeline's platform timeout (220 s of 300 s:
            :func:`rota.settings.default_time_budget`).
        maintenance: an object with ``async run_once() -> dict[str, int]``; default
            ``rota.Maintenance(pipeline.queue, platform_timeout=pipeline.platform_timeout)``
            (stuck jobs, killed runs, pruning; the pipeline's queue, whose give-up hooks
            are its stages', or ``queue`` for a pipeline without one). Runs when the
            worker starts and then every ``maintain_every``, as the start of a run so
            its counters land in the run's summary; ``maintain_every=None`` turns it
            off.
        rescue_every: how often stuck jobs are failed, owed give-up hooks run and
            killed runs closed (:class:`rota.maintenance.Rescue` on the same queue as
            the default maintenance: index reads), between
            the daily maintenance runs: every minute by default (River's rescuer runs
            every 30 s), so a job whose last attempt died is failed and refunded within
            minutes; the rescue also runs when the next unfinished run passes the stale
            window, so a SIGKILLed run shows as ``error``/``killed`` as soon as that can
            be known, not a day later (docs/design.md, "Maintenance"). Its counters are
            logged, not written as a run; ``None`` turns it off.
        reconnect_delay: first wait before reconnecting the listening connection; it
            doubles on each failure up to ``idle_poll``.
        keepalive: how long the listening connection may stay silent before the worker
            checks it with ``SELECT 1`` (default 5 s).
        liveness_timeout: how long that check, and the worker's own look at when the
            next job is due, may wait for an answer (default 5 s). A connection that
            stays open but stops answering (a frozen server, a hung proxy: TCP stays
            up, so no keepalive fires) is so noticed within ``keepalive`` plus
            ``liveness_timeout`` (10 s by default), logged once, discarded and replaced
            (docs/operations.md, "Network partitions and timeouts").
        wake_interval: after a look that a notification caused and that found nothing
            to run, the shortest time until a notification causes the next one (a flood
            of NOTIFY from any role costs at most one ``next_due`` query per interval);
            a look that ran jobs lets the next notification look at once. Default 0.2 s.
        fallback_poll: the longest sleep without asking the database while
            notifications do not reach the worker (the check when its listening
            connection first comes up failed: a transaction pooler without
            ``listen_url``); default 1 s.
        on_run: called with each run's result (for the CLI's log line).

    Raises:
        InvalidInput: a duration is not a positive ``timedelta``.
    """

    def __init__(
        self,
        pipeline: PipelineSource,
        *,
        queue: Queue | None = None,
        idle_poll: timedelta = timedelta(seconds=5),
        time_budget: timedelta | None = None,
        maintenance: Maintainer | None = None,
        maintain_every: timedelta | None = timedelta(days=1),
        rescue_every: timedelta | None = DEFAULT_RESCUE_EVERY,
        reconnect_delay: timedelta = timedelta(seconds=0.5),
        keepalive: timedelta = timedelta(seconds=5),
        liveness_timeout: timedelta = LIVENESS_TIMEOUT,
        wake_interval: timedelta = timedelta(seconds=0.2),
        fallback_poll: timedelta = timedelta(seconds=1),
        on_run: Callable[[Any], None] | None = None,
    ) -> None:
        self._source = pipeline
        self._queue = queue
        self.idle_poll = require_duration(idle_poll, "idle_poll")
        self.time_budget = (None if time_budget is None
                            else require_duration(time_budget, "time_budget"))
        self._budget = self.time_budget or DEFAULT_TIME_BUDGET  # set when it starts
        self.maintain_every = (
            None if maintain_every is None else require_duration(maintain_every, "maintain_every")
        )
        self.rescue_every = (
            None if rescue_every is None else require_duration(rescue_every, "rescue_every")
        )
        self.reconnect_delay = require_duration(reconnect_delay, "reconnect_delay")
        self.keepalive = require_duration(keepalive, "keepalive")
        self.liveness_timeout = require_duration(liveness_timeout, "liveness_timeout")
        # Whether the last look at the database failed: a failure is logged as a
        # warning once, until the database answers again.
        self._unreachable = False
        self.wake_interval = require_duration(wake_interval, "wake_interval")
        self.fallback_poll = require_duration(fallback_poll, "fallback_poll")
        #: Whether notifications reach the worker: ``None`` until its listening
        #: connection first came up and checked, ``False`` when they did not (it then
        #: polls every ``fallback_poll``).
        self.notifications: bool | None = None
        self._maintenance = maintenance
        self._on_run = on_run
        self._wake = asyncio.Event()
        # Whether the coming look was caused by a notification, and when the last such
        # look found nothing to run (monotonic; None: it ran jobs, or there was none).
        self._notified = False
        self._wasted_look: float | None = None
        self._reconnected = False  # the listener's own wake-up, not a notification
        #: Set while the listening connection is up and LISTENing (for tests and health).
        self.listening = asyncio.Event()
        #: The listening connection's server process id, while it is up.
        self.listen_pid: int | None = None
        self.runs = 0
        self.last_result: Any = None
        self.last_maintenance: Mapping[str, int] | None = None
        self.last_rescue: Mapping[str, int] | None = None
        self._rescued_at = -math.inf
        self._stop: asyncio.Event | None = None

    # -- the loop ----------------------------------------------------------------------

    async def run_forever(self, stop_event: asyncio.Event) -> None:
        """Run until ``stop_event`` is set, then return.

        A run in progress when the event is set stops claiming at once (a pipeline whose
        ``run`` takes ``stop``), lets what is in flight finish within its handler
        deadlines (so within the platform timeout), and hands unstarted jobs back as
        they were; after it no new run or maintenance starts. An idle worker returns at
        once, even while it waits for a database that does not answer. Database
        errors are logged once (until it answers again) and retried with a backoff
        (from ``reconnect_delay``, doubling up to ``idle_poll``), except rota's tables
        or schema missing, which no retry fixes. After every run it asks again when
        the next job is due and sleeps until then (at most ``idle_poll``).

        Raises:
            InvalidInput: the pipeline has no queue and none was given.
            ConfigError: ``time_budget`` is not shorter than the pipeline's
                ``platform_timeout`` (every run would refuse it); ``maintenance`` is a
                :class:`rota.Maintenance` built on another queue than the pipeline's.
            psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
                psycopg.errors.InvalidSchemaName: the schema is not migrated, or not to
                this version's last migration, or the groups relation does not exist
                (with a note saying so: :meth:`rota.store.Statements.note_missing`).
        """
        pipeline = await resolve_pipeline(self._source)
        queue = self._queue if self._queue is not None else getattr(pipeline, "queue", None)
        if not isinstance(queue, Queue):
            raise InvalidInput("Worker needs a rota.Queue: pass queue= or give the pipeline one")
        self._budget = self.time_budget or default_time_budget(
            getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT))
        check_time_budget(pipeline, self._budget)
        own = getattr(pipeline, "queue", None)
        if isinstance(own, Queue):  # else every run would refuse it, in a loop
            check_pipeline_maintenance(self._maintenance, own)
        types = _stage_types(pipeline)
        scheduler = getattr(pipeline, "scheduler", None)
        if not isinstance(scheduler, Scheduler):
            scheduler = None
        self._stop = stop_event
        listener = asyncio.create_task(self._listen(queue, stop_event), name="rota-listen")
        next_maintenance = time.monotonic()
        # Give-up hooks are the pipeline's queue's (its stages'), whatever queue the
        # worker listens on (docs/design.md, "The runner").
        hooks = pipeline_queue(pipeline, queue)
        maintainer = (None if self.maintain_every is None
                      else self._maintainer(pipeline, hooks))
        rescuer = None if self.rescue_every is None else Rescue(hooks, getattr(
            pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT))
        next_rescue = time.monotonic() + (self.rescue_every or timedelta(0)).total_seconds()
        backoff = self.reconnect_delay.total_seconds()
        # Whether the last run touched no job although work was due (a stage blocked by
        # its quota's reserve, say): due work that is still there then waits for a
        # wake-up, not another run at once.
        stalled = False
        try:
            while not stop_event.is_set():
                if maintainer is not None and time.monotonic() >= next_maintenance:
                    next_maintenance = time.monotonic() + await self._maintain(
                        pipeline, maintainer)
                    next_rescue = time.monotonic() + (
                        self.rescue_every or timedelta(0)).total_seconds()
                    if stop_event.is_set():  # asked to stop during the maintenance run
                        break
                if rescuer is not None:
                    # Also when the next unfinished run passes the stale window: a
                    # killed run is marked as soon as it can be known, busy or idle.
                    next_rescue = min(next_rescue, await self._killed_due(rescuer, stop_event))
                if rescuer is not None and time.monotonic() >= next_rescue:
                    rescued = await _until_stopped(stop_event, self._rescue(rescuer))
                    if rescued is None:  # asked to stop while waiting for the database
                        break
                    next_rescue = time.monotonic() + rescued
                # Cleared before asking, so an enqueue committed after the question was
                # asked still wakes the wait below.
                self._wake.clear()
                asked_at = time.monotonic()
                try:
                    # A stop request ends the wait for the database at once (nothing is
                    # held while asking), so one SIGTERM stops an idle worker whatever
                    # the database does.
                    asked = await _until_stopped(stop_event, self._due_in(
                        queue, types, scheduler))
                    if asked is None:
                        break
                    due_in = asked[0]
                except _FATAL_DB_ERRORS:
                    raise
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    self._cannot_reach(exc, backoff)
                    due_in, outcome = None, "error"
                else:
                    if self._unreachable:
                        self._unreachable = False
                        log.info("the database answers again")
                    outcome = "idle"
                    if due_in is not None and due_in <= 0 and not stalled:
                        if stop_event.is_set():  # asked to stop while asking
                            break
                        outcome = await self._run_once(pipeline)
                        self._looked(asked_at, outcome)
                        if outcome != "error":
                            # Ask again: the due time as it stands after the run (a
                            # retry's backoff, a deferral, a run_after it enqueued, a
                            # schedule's next tick) decides the sleep, never the one
                            # read before it.
                            backoff = self.reconnect_delay.total_seconds()
                            stalled = outcome == "stalled"
                            continue
                self._looked(asked_at, outcome)
                stalled = False
                if outcome == "error":
                    # The database is down or the run broke: back off (doubling up to
                    # idle_poll); the listener reconnecting (the database is back) or a
                    # new job wakes us sooner.
                    await self._sleep(stop_event, backoff, asked_at)
                    backoff = min(backoff * 2, self.idle_poll.total_seconds())
                    continue
                backoff = self.reconnect_delay.total_seconds()
                # Idle, or due work the run could not touch (its stage is blocked by a
                # quota reserve, say): sleep until the next job is due, at most idle_poll,
                # and no later than the next rescue.
                timeout = self.idle_poll.total_seconds()
                if self.notifications is False:  # nothing wakes it: poll
                    timeout = min(timeout, self.fallback_poll.total_seconds())
                if due_in is not None and due_in > 0:
                    timeout = min(timeout, due_in)
                if rescuer is not None:
                    next_rescue = min(next_rescue, await self._killed_due(rescuer, stop_event))
                    timeout = min(timeout, max(next_rescue - time.monotonic(), 0.0))
                await self._sleep(stop_event, timeout, asked_at)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _sleep(self, stop_event: asyncio.Event, seconds: float,
                     asked_at: float) -> None:
        """Sleep up to ``seconds`` after ``asked_at`` (the last look at the database); a
        notification ends it early (see :meth:`_notification_hold`)."""
        await _wait_any(stop_event, self._wake, seconds)
        if stop_event.is_set() or not self._wake.is_set():
            return
        # The listener's wake-up after (re)connecting is its own, not a stranger's.
        self._notified, self._reconnected = not self._reconnected, False
        hold = min(self._notification_hold(), asked_at + seconds) - time.monotonic()
        if hold > 0:
            await _wait_any(stop_event, None, hold)

    def _notification_hold(self) -> float:
        """Until when (monotonic) a notification must wait before it causes a look.

        Anyone can send one, so a look it causes is a hint followed, not a command: when
        the last such look found nothing to run, the next waits until ``wake_interval``
        after it (a flood costs one look per interval). When it ran jobs (or no
        notification caused one yet), the next looks at once: an enqueue is started
        within the round trips of a look and a claim, not a debounce."""
        if self._wasted_look is None:
            return 0.0
        return self._wasted_look + self.wake_interval.total_seconds()

    def _looked(self, asked_at: float, outcome: str) -> None:
        """Note what the look at ``asked_at`` led to, when a notification caused it:
        ``progress`` (jobs ran) frees the next notification's look; anything else holds
        it (see :meth:`_notification_hold`)."""
        if self._notified:
            self._notified = False
            self._wasted_look = None if outcome == "progress" else asked_at

    async def _run_once(self, pipeline: Any) -> str:
        """One run. Returns ``"progress"`` when it touched jobs (or ran out of budget:
        there is more), ``"stalled"`` when it touched none, ``"error"`` when it raised or
        stopped with ``error``."""
        try:
            result = await pipeline.run(trigger="worker", time_budget=self._budget,
                                        **self._stop_arg(pipeline))
        except Exception as exc:
            log.error("run failed: %s", first_line(exc, with_type=True))
            return "error"
        self._record(result)
        if result.stop_reason == "error":
            log.error("run %s stopped with error: %s", result.run_id, result.error)
            return "error"
        touched = result.jobs_done + result.jobs_failed + result.jobs_deferred
        return "progress" if touched or result.stop_reason == "time_budget" else "stalled"

    def _stop_arg(self, pipeline: Any) -> dict[str, Any]:
        """``stop=`` for a pipeline whose ``run`` takes it: a stop request then ends the
        run's budget at once instead of after it."""
        if self._stop is not None and "stop" in inspect.signature(pipeline.run).parameters:
            return {"stop": self._stop}
        return {}

    async def _rescue(self, rescuer: Rescue) -> float:
        """Fail stuck jobs, run owed give-up hooks and close killed runs; returns seconds
        until the next time (sooner after a failure is not needed: the interval is
        short)."""
        assert self.rescue_every is not None
        self._rescued_at = time.monotonic()
        try:
            counters = await rescuer.run_once()
        except Exception as exc:
            log.error("stuck-job rescue failed: %s", first_line(exc, with_type=True))
        else:
            self.last_rescue = counters
            if any(counters.values()):
                log.info("rescue: %s",
                         ", ".join(f"{k}={v}" for k, v in counters.items()))
        return self.rescue_every.total_seconds()

    async def _killed_due(self, rescuer: Rescue, stop_event: asyncio.Event) -> float:
        """When (monotonic) the next unfinished run will have been silent for the stale
        window, a little after so the rescue finds it past; ``inf`` when none is
        unfinished, the database does not answer (the usual rescue interval then
        applies) or a stop was asked for meanwhile (which ends the wait at once)."""
        try:
            asked = await _until_stopped(stop_event, asyncio.wait_for(
                rescuer.next_killed_in(), self.liveness_timeout.total_seconds()))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.debug("could not ask when a run goes stale: %s", exc)
            return math.inf
        due = None if asked is None else asked[0]
        if due is None:
            return math.inf
        # At most one rescue a second for it: one that keeps failing is not a busy loop.
        return max(time.monotonic() + max(due, 0.0) + 0.1, self._rescued_at + 1.0)

    def _cannot_reach(self, exc: BaseException, backoff: float) -> None:
        """Log a failed look at the database: a warning the first time, then quietly
        until it answers again (a database down for an hour is one line, not 720)."""
        text = first_line(exc, with_type=True)
        if self._unreachable:
            log.debug("still cannot reach the database (%s); retrying in %.1fs", text,
                      backoff)
        else:
            self._unreachable = True
            log.warning("cannot reach the database (%s); retrying (from %.1fs, up to "
                        "%.1fs apart) and saying so when it answers again", text, backoff,
                        self.idle_poll.total_seconds())

    async def _due_in(self, queue: Queue, types: Sequence[str] | None,
                      scheduler: Scheduler | None) -> tuple[float | None]:
        """When the next job (or schedule tick) is due, in seconds (a one-tuple, so
        :func:`_until_stopped` can tell "never" from "stopped")."""
        due_in = await self._next_due(queue, types)
        if scheduler is not None:  # wake in time for the next tick
            due_in = _earliest(due_in, await scheduler.due_in())
        return (due_in,)

    async def _next_due(self, queue: Queue, types: Sequence[str] | None) -> float | None:
        await queue.open()
        return await statements.next_due(
            queue.store, types=types, offset=queue.clock_offset,
            stale_after=queue.stale_after, deadline=self.liveness_timeout.total_seconds())

    def _maintainer(self, pipeline: Any, queue: Queue) -> Maintainer:
        if self._maintenance is not None:
            return self._maintenance
        return Maintenance(queue, platform_timeout=getattr(
            pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT))

    async def _maintain(self, pipeline: Any, maintainer: Maintainer) -> float:
        """Run maintenance; returns seconds until the next time (sooner after a failure).

        When the pipeline's ``run`` takes ``maintenance``, maintenance runs as the start
        of a run, so its counters land in that run's summary (``maintenance.*``);
        otherwise it runs on its own and its counters are logged."""
        assert self.maintain_every is not None
        every = self.maintain_every.total_seconds()
        try:
            if "maintenance" in inspect.signature(pipeline.run).parameters:
                result = await pipeline.run(trigger="worker", time_budget=self._budget,
                                            maintenance=maintainer,
                                            **self._stop_arg(pipeline))
                self._record(result)
                if result.stop_reason == "error":
                    raise RuntimeError(result.error or "the maintenance run ended in error")
                summary = result.summary or {}
                counters = {k.removeprefix("maintenance."): int(v)
                            for k, v in summary.items() if k.startswith("maintenance.")}
            else:
                counters = await maintainer.run_once()
        except Exception as exc:
            log.error("maintenance failed: %s; retrying in a minute",
                      first_line(exc, with_type=True))
            return min(every, 60.0)
        self.last_maintenance = counters
        log.info("maintenance: %s", ", ".join(f"{k}={v}" for k, v in counters.items()) or "-")
        return every

    def _record(self, result: Any) -> None:
        self.runs += 1
        self.last_result = result
        if self._on_run is not None:
            self._on_run(result)

    # -- waking ------------------------------------------------------------------------

    async def _listen(self, queue: Queue, stop_event: asyncio.Event) -> None:
        """Keep one connection LISTENing on the schema's channel; set the wake event on
        each notification, whatever its payload and sender (it is only a hint to look),
        and after each (re)connect, since notifications sent while it was down are
        lost."""
        delay = self.reconnect_delay.total_seconds()
        channel = sql.SQL("LISTEN {}").format(sql.Identifier(queue.schema))
        limit = self.liveness_timeout.total_seconds()
        lost = False  # logged once until the connection is back
        while not stop_event.is_set():
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                # Connecting and LISTEN are bounded too: a proxy may take the TCP
                # connection and never answer (connect_timeout is 10 s).
                try:
                    conn = await _within(limit + 10, queue.listener(through_pooler=True))
                except RotaError as exc:  # listen_url refused: no retry mends it
                    log.error("%s; polling every %gs instead", first_line(exc),
                              self.fallback_poll.total_seconds())
                    self.notifications = False
                    self._wake.set()
                    return
                assert conn is not None
                if self.notifications is None:
                    problem = await _within(limit * 2 + PROBE_WAIT.total_seconds(),
                                            probe(queue, conn, self._wake))
                    self.notifications = problem is None
                    if problem is not None:
                        log.warning("%s; polling every %gs instead", problem,
                                    self.fallback_poll.total_seconds())
                        self._wake.set()  # the next sleep is fallback_poll at most
                        return
                await _within(limit, conn.execute(channel))
                self.listen_pid = conn.info.backend_pid
                self.listening.set()
                self._reconnected = True
                self._wake.set()
                delay = self.reconnect_delay.total_seconds()
                if lost:
                    lost = False
                    log.info("listening connection back")
                while True:
                    async for _ in conn.notifies(timeout=self.keepalive.total_seconds()):
                        self._wake.set()
                    # The liveness check: a connection that stays open but no longer
                    # answers shows up only here.
                    await _within(limit, conn.execute("SELECT 1"))
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if not lost:
                    lost = True
                    log.warning("listening connection lost (%s); reconnecting (from "
                                "%.1fs apart), and saying so when it is back",
                                first_line(exc, with_type=True), delay)
            finally:
                self.listening.clear()
                self.listen_pid = None
                if conn is not None:
                    _discard(conn)
            await _wait_any(stop_event, None, delay)
            delay = min(delay * 2, self.idle_poll.total_seconds())


async def probe(queue: Queue, conn: psycopg.AsyncConnection[Any],
                wake: asyncio.Event | None = None) -> str | None:
    """Check that notifications sent through the queue's pool reach ``conn``, a LISTEN
    connection (the worker's, made by :meth:`rota.Queue.listener`): one of
    the worker's own, on :data:`PROBE_CHANNEL`, waited for :data:`PROBE_WAIT`
    (docs/operations.md, "Poolers and failover"). Also tells whether ``conn`` goes
    through a connection pooler (its backend process id is not the server's).

    Args:
        queue: the queue (its pool sends the notification).
        conn: the LISTEN connection, autocommit.
        wake: set when a notification of another channel arrives meanwhile (the
            worker's wake-ups).

    Returns:
        ``None`` when the notification arrived, else one line saying why not.

    Raises:
        psycopg.Error, OSError: a connection failed (the check is not done).
    """
    token = uuid.uuid4().hex
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))
    row = await statements.notify_probe(queue.store, token=token)
    arrived = False
    async for note in conn.notifies(timeout=PROBE_WAIT.total_seconds()):
        if note.channel == PROBE_CHANNEL and note.payload == token:
            arrived = True
            break
        if wake is not None:
            wake.set()
    cur = await conn.execute("SELECT pg_backend_pid(), current_database()")
    pid, database = await cur.fetchone() or (None, None)
    pooler = pid != conn.info.backend_pid
    await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))
    listen_url = queue.connections.listen_url is not None
    if arrived:
        if listen_url and pooler:
            log.warning("listen_url goes through a connection pooler (its backend process "
                        "id is not the server's): wake-ups last only while the pooler "
                        "keeps the session; point listen_url at the server itself")
        return None
    sent_to = None if row is None else row[1]
    if listen_url and sent_to != database:
        return (f"listen_url connects to database {database!r}, the queue to "
                f"{sent_to!r}: notifications of the queue's database do not reach it")
    if listen_url and pooler:
        return ("listen_url goes through a connection pooler in transaction mode "
                "(its backend process id is not the server's): notifications do not "
                "reach it; point listen_url at the server itself")
    if listen_url:
        return (f"notifications sent through the queue's connection do not reach "
                f"listen_url within {PROBE_WAIT.total_seconds():g}s (another server?)")
    return (f"notifications do not reach the worker within "
            f"{PROBE_WAIT.total_seconds():g}s (a transaction pooler?); set listen_url "
            "(ROTA_LISTEN_URL) to a direct connection for wake-ups at once")


async def _within(seconds: float, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`TimeoutError` at once after ``seconds``: the
    work is cancelled but not waited for (psycopg's cancellation of a statement over a
    silent link takes up to 10 s more; it then closes the connection itself).

    Raises:
        TimeoutError: no result within ``seconds``.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieve)
    raise TimeoutError(f"no answer within {seconds:g} s")


async def _until_stopped(stop: asyncio.Event, work: Awaitable[T]) -> T | None:
    """``work``'s result, or ``None`` as soon as ``stop`` is set (the work is then
    cancelled, not waited for: it holds nothing a stop must settle)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieve)
    return None


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read an abandoned task's outcome, so asyncio does not log it as never
    retrieved."""
    if not task.cancelled():
        task.exception()


def _discard(conn: psycopg.AsyncConnection[Any]) -> None:
    """Close the listening connection without waiting on the network: ``close`` only
    sends a Terminate message, but an ``async with`` exit would wait for a statement
    still being cancelled."""
    if not conn.closed:
        with contextlib.suppress(Exception):
            conn.pgconn.finish()


def _earliest(a: float | None, b: float | None) -> float | None:
    """The sooner of two "due in" values, ``None`` meaning never."""
    return b if a is None else a if b is None else min(a, b)


def _stage_types(pipeline: Any) -> list[str] | None:
    """The job types the pipeline's stages run, or ``None`` (all types) when it does not
    say."""
    stages = getattr(pipeline, "stages", None)
    if not stages:
        return None
    types = [getattr(s, "type", None) for s in stages]
    return [t for t in types if isinstance(t, str)] or None


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event | None, seconds: float) -> None:
    """Sleep up to ``seconds``, returning early when ``stop`` or ``wake`` is set."""
    if stop.is_set() or (wake is not None and wake.is_set()):
        return
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=max(seconds, 0.0),
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


__all__ = ["PROBE_CHANNEL", "PROBE_WAIT", "Worker", "probe"]

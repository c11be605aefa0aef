"""The pipeline runner: stages, the run loop, the time budget and stop reasons
(docs/design.md, "The runner").

A :class:`Pipeline` is an ordered list of :class:`Stage` objects. One call of
:meth:`Pipeline.run` is one *run* (one row of ``runs``): it claims one batch from the
first stage that has work, runs it with the stage's concurrency, and starts again from
the top, until there is no work, the time budget is spent, or only quota-blocked work is
left. Handlers get a :class:`JobContext`.

One piece (about 800 lines): the loop, the prefetch, the heartbeat, the handler
deadlines, the quota skip and the runs-row saves all read and write one
:class:`RunState` under one time budget, and their order is the run's correctness (a
batch is claimed only after the previous completion was handed over; unstarted jobs go
back before the end is recorded; nothing outlives the hard deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from datetime import datetime, timedelta

import psycopg
from psycopg_pool import PoolTimeout

from ..checks import require_duration
from ..errors import ConfigError, InvalidInput, UnreadableJob, first_line
from ..job import DeferJob, Job
from ..maintenance import Maintainer
from ..queue import AnyConn, Queue
from ..quota import SHARED_SCOPE, Allowance, Quota, QuotaExhausted
from ..rates import RateLimit, RateLimited
from ..schedule import Schedule, Scheduler
from ..settings import DEFAULT_PLATFORM_TIMEOUT, DEFAULT_TIME_BUDGET
from ..store import is_connection_failure
from . import rates
from .batching import BatchSize
from .completer import Completer, error_text, settle_all
from .context import JobContext, RunState, retrying
from .stage import (
    TRIGGERS,
    RunResult,
    Stage,
    StopReason,
    Trigger,
)

log = logging.getLogger("rota.runner")

# Waits between attempts to record a run's end after a connection failure (about 7 s in
# all: a fast restart of PostgreSQL takes well under that).
_END_RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0, 4.0)
# Between batches the runs row is saved at most this often (seconds); the heartbeat and
# the end of the run save it too. A save per batch cost a commit per 25 jobs.
SAVE_EVERY_S = 1.0
#: Connections the runner itself needs beside its handlers' (docs/design.md,
#: "Connections"): the claim (or the prefetch) and the completions it overlaps; the
#: heartbeat and the claim upkeep take turns on them briefly.
RUNNER_CONNECTIONS = 2
# The part of the platform timeout kept for settling after the last handlers are cut
# (failing them, handing back the unstarted, recording the end): a tenth, at least a
# second, but never more than a quarter nor more than 30 s (30 s of 300 s).
_SETTLE_RESERVE_SHARE = 0.1
_SETTLE_RESERVE_MIN = timedelta(seconds=1)
_SETTLE_RESERVE_MAX = timedelta(seconds=30)


# What a run's summary becomes when the runs row refuses it, so its end is recorded.
_UNSTORABLE = {"summary_unstorable": 1}


class RunOverran(Exception):
    """The run was still busy at its hard deadline (a handler ignored its cancellation,
    or the database stopped answering): it was cut, its jobs settled, and it ended in
    error."""


class Pipeline:
    """An ordered list of stages run against one queue (docs/design.md, "The runner").

    Args:
        queue: the :class:`rota.Queue`.
        stages: in runner order: earlier stages win (put work-generating stages last).
        quotas: quotas and allowances handlers may name in ``ctx.spend("name", n)``
            (stages' quotas are added automatically).
        rate_limits: rate limits handlers may name in ``ctx.take("name", n)`` (stages'
            limits are added automatically; docs/design.md, "Rates").
        platform_timeout: how long the platform lets one invocation live (default 300 s).
            The queue's stale window must be longer, so a lock only looks stale when its
            holder is dead; runs' budgets must be shorter.
        heartbeat_every: how often a run refreshes the locks of the jobs it holds and
            saves its progress (default a third of ``platform_timeout``); at most half
            the platform timeout, so a live run never looks killed or stale.
        schedules: :class:`rota.Schedule` objects: each run starts by enqueueing their
            due ticks, once across every worker (docs/design.md, "Schedules"); a
            :class:`rota.Worker` wakes in time for the next one. Each one's type must be
            one of the stages'.
        handler_timeout: how long one handler call may run in stages that set no
            ``timeout`` (default half the platform timeout); shorter than the platform
            timeout (docs/design.md, "Handler deadlines").

    The pipeline's pool must hold a connection per concurrent handler plus
    ``RUNNER_CONNECTIONS`` for the runner (docs/design.md, "Connections"): the queue's
    own pool is grown to that at the start of a run; a caller's pool that is smaller is
    refused here.

    Raises:
        ConfigError: ``queue.stale_after <= platform_timeout`` ("the stale window is safe
            by construction"), duplicate stage types or quota names, a stage's
            ``max_attempts`` that conflicts with the queue's per-type setting, a bad
            heartbeat interval, two schedules with one name, a schedule whose type no
            stage runs, a handler timeout not shorter than the platform timeout, or a
            caller's pool too small for the stages' concurrency.
        UnknownJobType: a stage's type is not among the queue's declared types.
    """

    def __init__(
        self,
        queue: Queue,
        stages: Sequence[Stage],
        *,
        quotas: Iterable[Quota | Allowance] = (),
        rate_limits: Iterable[RateLimit] = (),
        platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT,
        heartbeat_every: timedelta | None = None,
        schedules: Iterable[Schedule] = (),
        handler_timeout: timedelta | None = None,
    ) -> None:
        if not isinstance(queue, Queue):
            raise InvalidInput("Pipeline needs a rota.Queue")
        self.queue = queue
        self.stages = tuple(stages)
        # Claim sizes of the stages whose batch the runner chooses, kept across runs.
        self._sizes: dict[str, BatchSize] = {}
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
        self.settle_reserve = min(
            max(self.platform_timeout * _SETTLE_RESERVE_SHARE, _SETTLE_RESERVE_MIN),
            self.platform_timeout / 4, _SETTLE_RESERVE_MAX)
        self.handler_timeout = require_duration(
            handler_timeout if handler_timeout is not None else self.platform_timeout / 2,
            "handler_timeout")
        for name, limit in [("handler_timeout", self.handler_timeout),
                            *((f"stage {s.type!r}: timeout", s.timeout)
                              for s in self.stages if s.timeout is not None)]:
            if limit >= self.platform_timeout:
                raise ConfigError(f"{name} ({limit}) must be shorter than the platform "
                                  f"timeout ({self.platform_timeout})")
        types = [queue.check_type(s.type) for s in self.stages]
        if len(set(types)) != len(types):
            raise ConfigError(f"duplicate stage types in {types}")
        self._quotas: dict[str, Quota | Allowance] = {}
        for q in [*(s.quota for s in self.stages if s.quota is not None), *quotas]:
            if not isinstance(q, Quota | Allowance):
                raise InvalidInput(f"quotas must be rota.Quota or rota.Allowance, got {q!r}")
            if self._quotas.setdefault(q.name, q) != q:
                raise ConfigError(f"two different quotas are named {q.name!r}")
        self._rate_limits = rates.collect_limits(self.stages, rate_limits)
        # Handlers holding a connection while the runner needs one to settle their jobs
        # would wait on each other until the pool times out, and each timeout cost a
        # job an attempt (6 of 8 jobs at concurrency = pool size).
        widest = max(self.stages, key=_handler_slots)
        self.connections_needed = _handler_slots(widest) + RUNNER_CONNECTIONS
        if not queue.owns_pool and queue.pool.max_size < self.connections_needed:
            raise ConfigError(
                f"stage {widest.type!r}: concurrency {_handler_slots(widest)} needs a pool "
                f"of at least {self.connections_needed} connections (one per handler and "
                f"{RUNNER_CONNECTIONS} for the runner); the queue's pool has max_size "
                f"{queue.pool.max_size}: raise it or lower the concurrency")
        for s in self.stages:
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
        self.scheduler = Scheduler(queue, schedules)
        for sched in self.scheduler.schedules:
            if sched.type not in types:
                raise ConfigError(f"schedule {sched.name!r} enqueues {sched.type!r}, which "
                                  f"no stage of this pipeline runs")

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

    def rate_limit(self, name: str) -> RateLimit:
        """The rate limit called ``name``.

        Raises:
            ConfigError: no such limit was given to the pipeline or its stages.
        """
        try:
            return self._rate_limits[name]
        except KeyError:
            raise ConfigError(f"unknown rate limit {name!r}; known: "
                              f"{', '.join(sorted(self._rate_limits)) or 'none'}") from None

    @property
    def rate_limits(self) -> tuple[RateLimit, ...]:
        """The pipeline's rate limits (its stages' and those given to it)."""
        return tuple(self._rate_limits.values())

    async def run(
        self,
        trigger: Trigger = "cron",
        time_budget: timedelta = DEFAULT_TIME_BUDGET,
        *,
        maintenance: Maintainer | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult:
        """Run the pipeline once, inside ``time_budget`` (docs/design.md, "The runner").

        The loop claims one batch from the first stage that has work (and is not
        blocked by its quota), runs it with the stage's concurrency, then starts again
        from the top. After the budget (or once ``stop`` is set) no batch is claimed;
        jobs in flight finish within their handler timeout; claimed jobs not yet
        started are handed back as they were (attempts and deferrals unchanged). No
        database transaction is open while a handler runs. Every handler is cancelled
        by the run's hard deadline, the platform timeout less a reserve for settling,
        so the run ends before the platform timeout (docs/design.md, "Handler
        deadlines"). Jobs whose handlers return
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
            stop: an event that ends the budget early when set (a worker's SIGTERM):
                nothing more is claimed, what is in flight finishes.

        After maintenance, the pipeline's schedules enqueue their due ticks
        (:meth:`rota.schedule.Scheduler.run_once`; non-zero counters land in the summary
        as ``schedules.*``).

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
        run = RunState(uuid.uuid4(), trigger, time_budget,
                       self.platform_timeout - self.settle_reserve, stop)
        q = self.queue
        async with q.connection() as c:
            row = await q.store.fetch_one("run_start", {
                "id": run.id, "trigger": trigger, "offset": q.clock_offset}, conn=c)
        assert row is not None
        started_at: datetime = row[0]
        await self._size_pool()
        heartbeat = asyncio.create_task(self._heartbeat(run))
        reason: StopReason
        error: str | None = None
        try:
            if maintenance is not None:
                for k, v in (await maintenance.run_once()).items():
                    run.add(f"maintenance.{k}", v)
            if self.scheduler.schedules:
                for k, v in (await self.scheduler.run_once()).items():
                    if v:
                        run.add(f"schedules.{k}", v)
            reason = await self._within_deadline(run)
        except asyncio.CancelledError:
            await self._finish_quietly(run, "error", "cancelled")
            raise
        except RunOverran as exc:  # said and settled in _within_deadline: no traceback
            log.error("run %s ended in error: %s", run.id, exc)
            reason, error = "error", error_text(exc)
        except Exception as exc:
            log.exception("run %s ended in error", run.id)
            reason, error = "error", error_text(exc)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        finished_at = await self._save_end(run, reason, error)
        log.info("run %s (%s) stopped %s: %d done, %d failed, %d deferred%s", run.id,
                 trigger, reason, run.jobs_done, run.jobs_failed, run.jobs_deferred,
                 f": {error}" if error else "")
        return RunResult(run.id, trigger, reason, run.jobs_done, run.jobs_failed,
                         run.jobs_deferred, run.quota_units, dict(run.summary), error,
                         started_at, finished_at)

    async def _size_pool(self) -> None:
        """Grow the queue's own pool to what the stages need (docs/design.md,
        "Connections"); a caller's pool was checked at construction."""
        pool = self.queue.pool
        if self.queue.owns_pool and pool.max_size < self.connections_needed:
            log.info("growing the queue's pool from %d to %d connections for %s",
                     pool.max_size, self.connections_needed,
                     ", ".join(s.type for s in self.stages))
            await pool.resize(pool.min_size, self.connections_needed)

    async def _within_deadline(self, run: RunState) -> StopReason:
        """Run the loop, and cut it if it is still busy a quarter of the settle reserve
        after the hard deadline: every handler was cancelled by that deadline, so only
        a handler that ignores cancellation (or a database that stopped answering)
        keeps it. It gets another quarter to stop; then what it held is settled here
        and the run ends in error, with half the reserve left to record it, before the
        platform timeout (docs/design.md, "Handler deadlines").

        Raises:
            RunOverran: the loop had to be cut.
        """
        task = asyncio.get_running_loop().create_task(self._loop(run))
        grace = self.settle_reserve.total_seconds() / 4
        cut_at = run.hard_deadline + grace
        try:
            await asyncio.wait({task}, timeout=max(cut_at - time.monotonic(), 0.0))
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task}, timeout=grace)
            if not task.done():
                await self._abandon(run)
            raise
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait({task}, timeout=grace)
        if not task.done():
            await self._abandon(run)
        elif not task.cancelled() and task.exception() is None:
            return task.result()
        raise RunOverran("the run was still busy after its hard deadline (a handler "
                         "ignored its cancellation, or the database stopped answering): "
                         "cut before the platform timeout")

    async def _abandon(self, run: RunState) -> None:
        """Settle what a loop left behind when it would not stop: jobs whose handler
        did not stop when cancelled fail (retried with backoff), jobs never started go
        back as they were. The handler may go on in the background; fencing makes its
        late settlement a no-op."""
        held = [c for c in list(run.held.values()) if not c.settled]
        log.error("run %s: cut at its hard deadline; settling %d jobs it left behind",
                  run.id, len(held))
        unstarted = [c for c in held if not c.started]
        if unstarted:
            with contextlib.suppress(Exception):
                await self._hand_back(run, unstarted, None)
        for c in held:
            if c.started and not c.settled:
                with contextlib.suppress(Exception):
                    run.add("timed_out")
                    await c.fail("timed out: the handler did not stop when cancelled at "
                                 "the run's hard deadline")

    # -- the loop ----------------------------------------------------------------------

    async def _loop(self, run: RunState) -> StopReason:
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

    async def _claim_and_run(self, run: RunState) -> StopReason:
        while True:
            for i, stage in enumerate(self.stages):
                # After the budget no new batch is claimed.
                if run.out_of_time():
                    return "time_budget"
                if stage.type in run.skipped or rates.waiting(run, stage):
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
                    room = (await rates.claim_room(self.queue, run, stage)
                            if stage.limits else None)
                    if room == 0:  # waiting for its rate limits' units
                        continue
                    jobs = await self._claim(run, stage, room)
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
                if (stage.prefetch and stage.quota is None and not stage.limits
                        and all(s.type in run.skipped for s in self.stages[:i])):
                    run.prefetched = (stage, asyncio.get_running_loop().create_task(
                        self._claim(run, stage)))
                started = time.monotonic()
                run.finishing = await self._run_batch(run, stage, jobs)
                sizer = self._sizes.get(stage.type)
                if sizer is not None:
                    sizer.observe(len(jobs), time.monotonic() - started)
                if run.finishing is None:
                    await self._save_progress(run)
                break  # start again from the top: earlier stages win
            else:
                # Only stages waiting for rate-limit units may have work: sleep until
                # the first can go on (docs/design.md, "Rates").
                if run.rate_waits and await rates.wait_for_units(self.queue, run,
                                                                 self.stages):
                    continue
                if run.blocked:
                    return ("quota_exhausted" if "exhausted" in run.blocked
                            else "quota_reserve")
                return "no_work"

    def batch_size(self, stage: Stage) -> int:
        """The size of ``stage``'s next claim: its ``batch``, or when that is ``None``
        the size the runner has settled on (:class:`~rota.runner.batching.BatchSize`)."""
        if stage.batch is not None:
            return stage.batch
        return self._sizes.setdefault(stage.type, BatchSize(stage.concurrency)).size

    async def _claim(self, run: RunState, stage: Stage,
                     room: int | None = None) -> list[Job]:
        """Claim a batch of ``stage`` (at most ``room`` jobs: what its rate limits
        let start soon); rows that cannot be read were given up by the claim and count
        as failed here (docs/design.md, "Bad data belongs to its job")."""
        unreadable: list[UnreadableJob] = []
        size = self.batch_size(stage) if room is None else min(self.batch_size(stage), room)
        jobs = await self.queue.claim(stage.type, size, run_id=run.id,
                                      unreadable=unreadable)
        if unreadable:
            run.jobs_failed += len(unreadable)
            run.add("unreadable", len(unreadable))
        return jobs

    async def _release_prefetched(self, run: RunState) -> None:
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

    async def _finished(self, run: RunState) -> None:
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

    async def _skip(self, run: RunState, stage: Stage, block: QuotaExhausted) -> None:
        """Skip a quota-blocked stage for the rest of the run; its pending jobs, and its
        running jobs whose lock went stale (a dead run's, which no run would reclaim
        before the reset), wait for the reset as pending. Work left waiting for it makes
        the run's stop reason a quota one."""
        run.skipped.add(stage.type)
        q = self.queue
        async with q.connection() as c:
            # Pending jobs, and running jobs whose lock went stale (their run died),
            # wait for the reset: no run claims this stage before it.
            postponed = await q.store.execute("postpone", {
                "type": stage.type, "until": block.resets_at, "offset": q.clock_offset,
                "stale_after": q.stale_after}, conn=c)
            if postponed > 0:
                run.add("postponed", postponed)
            row = await q.store.fetch_one("quota_blocked_work", {
                "type": stage.type, "until": block.resets_at}, conn=c)
        if row is not None and row[0]:
            run.blocked.add(block.reason)
        log.info("run %s: stage %r skipped: %s", run.id, stage.type, block)

    async def _run_batch(self, run: RunState, stage: Stage,
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
        completer = Completer(self.queue, run)
        handed_over = False
        try:
            if stage.batch_handler is not None:
                todo.clear()
                going = ctxs
                if stage.limits:  # one unit per job; the refused are deferred
                    going = [c for c in ctxs
                             if await rates.take_for_job(self.queue, run, stage, c)]
                if going:
                    await self._call(stage.batch_handler(going), going, run, stage,
                                     blocked, completer)
            else:
                handler = stage.handler
                assert handler is not None

                async def worker() -> None:
                    # After the budget, or once the stage's quota is gone, jobs not yet
                    # started stay in `todo` and are deferred back below.
                    while todo and not run.out_of_time() and not blocked:
                        ctx = todo.popleft()
                        if stage.limits and not await rates.take_for_job(
                                self.queue, run, stage, ctx):
                            continue  # deferred until its units are there
                        await self._call(handler(ctx), [ctx], run, stage, blocked,
                                         completer)

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

    async def _complete_batch(self, run: RunState, ctxs: list[JobContext],
                              completer: Completer) -> None:
        """Finish a batch whose handlers all ran: wait for its completions, hand back
        whatever is still unsettled (as _run_batch does inline), save the progress."""
        try:
            await completer.wait()
        finally:
            await completer.wait_quietly()
            await self._release(run, ctxs, None)
        await self._save_progress(run)

    async def _save_progress(self, run: RunState) -> None:
        """Save the run's counters after a batch, at most every ``SAVE_EVERY_S``. A
        save the row refuses is logged, not fatal: the run's end is recorded anyway
        (:meth:`_save_end`)."""
        if time.monotonic() - run.saved_at >= SAVE_EVERY_S and not run.ended:
            try:
                await self._save(run)
            except psycopg.Error as exc:
                if is_connection_failure(exc):
                    raise
                log.error("run %s: could not save its progress: %s", run.id,
                          first_line(exc, with_type=True))

    def _limit(self, stage: Stage) -> float:
        """Seconds one handler call of ``stage`` may run."""
        return (stage.timeout or self.handler_timeout).total_seconds()

    async def _call(self, work: Awaitable[None], ctxs: list[JobContext], run: RunState,
                    stage: Stage, blocked: list[QuotaExhausted],
                    completer: Completer) -> None:
        """Run one handler call within its deadline and settle what it left unsettled
        (jobs it returned normally from are handed to ``completer``, which completes
        them in batches).

        The deadline is the stage's timeout from now, or the run's hard deadline when
        that comes first; at it the handler is cancelled and its jobs fail ("timed out
        after N s") and are retried with backoff (docs/design.md, "Handler
        deadlines")."""
        started = time.monotonic()
        deadline = min(started + self._limit(stage), run.hard_deadline)
        for ctx in ctxs:
            ctx.started = True
            ctx.deadline = deadline
        loop = asyncio.get_running_loop()
        timer = asyncio.timeout_at(loop.time() + (deadline - started))
        failure: Exception | None = None
        try:
            async with timer:
                await work
        except Exception as exc:  # DeferJob and QuotaExhausted included
            failure = exc
        # A job completed in the handler's own transaction is done only if that
        # transaction committed (docs/design.md, "Counters show what committed").
        await self._confirm_commits(run, ctxs, failure)
        if timer.expired():
            text = f"timed out after {round(deadline - started, 1):g} s"
            log.warning("job(s) %s: %s", [c.job.id for c in ctxs], text)
            run.add("timed_out", sum(1 for c in ctxs if not c.settled))
            await settle_all(ctxs, lambda c: c.fail(text))
        elif failure is None:
            completer.add([c for c in ctxs if not c.settled])
        elif isinstance(failure, DeferJob):
            until = failure.until
            await settle_all(ctxs, lambda c: c.defer(until))
        elif isinstance(failure, QuotaExhausted):
            if failure.scope_key == SHARED_SCOPE:
                blocked.append(failure)
            resets_at = failure.resets_at
            n = await settle_all(ctxs, lambda c: c.defer(resets_at))
            run.add("quota_deferred", n)
        elif isinstance(failure, RateLimited):
            await rates.defer_for_rate(self.queue, run, stage, ctxs, failure)
        elif isinstance(failure, PoolTimeout) and any(c.pool_timed_out for c in ctxs):
            # rota's pool had no connection for the handler: not the job's failure.
            # Handed back as it was, due after this run (docs/design.md, "Connections").
            log.warning("job(s) %s: no connection within the pool's timeout; handed back",
                        [c.job.id for c in ctxs])
            unsettled = [c for c in ctxs if not c.settled]
            run.add("pool_timeouts", len(unsettled))
            await self._hand_back(run, unsettled, None, after_run=True)
        else:
            log.info("job(s) %s raised %s", [c.job.id for c in ctxs], error_text(failure))
            error = failure
            await settle_all(ctxs, lambda c: c.fail(error))

    async def _confirm_commits(self, run: RunState, ctxs: list[JobContext],
                               failure: Exception | None) -> None:
        """Settle the jobs a handler completed in its own transaction by what the
        database says now: done under this claim (it committed), still running under it
        (it did not: the job fails with the handler's error and its backoff), or lost."""
        waiting = [c for c in ctxs if c.in_caller_tx]
        if not waiting:
            return
        jobs = [c.job for c in waiting]
        states = await retrying(lambda: self.queue.claim_states(jobs), run, "confirm")
        for c in waiting:
            c.in_caller_tx = False
            state = states.get(c.job.id)
            if state == "done":
                c._settle("done")
            elif state == "running":
                reason: Exception | str = (
                    failure if failure is not None
                    else "the transaction that completed the job did not commit")
                log.info("job %s: completed in a transaction that did not commit: %s",
                         c.job.id, reason)
                await c.fail(reason)
            else:
                c._settle("lost")

    async def _hand_back(self, run: RunState, ctxs: list[JobContext],
                         blocked: QuotaExhausted | None, *, after_run: bool = False) -> None:
        """Release claimed jobs as they were: attempts and deferrals unchanged, the due
        time kept (or, ``after_run``, not before this run's budget ends, so it does not
        claim them again) (docs/design.md, "Defer")."""
        not_before = None
        if after_run and run.time_left() > 0:
            not_before = await self.queue.now() + timedelta(seconds=run.time_left())
        jobs = [c.job for c in ctxs]
        n = await retrying(lambda: self.queue.release(jobs, not_before=not_before), run,
                           "release")
        for c in ctxs:
            c.outcome = "released"
            run.held.pop(c.job.id, None)
        run.add("released", n)
        if n < len(ctxs):  # reclaimed by another run meanwhile
            run.add("lost", len(ctxs) - n)

    async def _release(self, run: RunState, ctxs: list[JobContext],
                       blocked: QuotaExhausted | None) -> None:
        """Hand back what a batch still holds: jobs never started go back as they were
        (attempts and deferrals unchanged: docs/design.md, "Defer"); when the stage's
        quota is gone, the skip that follows moves them to its reset. Jobs started but
        unsettled (the run is ending in error or cancelled) are failed, so they are
        retried after backoff rather than waiting for the stale window."""
        unstarted = [c for c in ctxs if not c.settled and not c.started]
        if unstarted:
            try:
                await self._hand_back(run, unstarted, blocked)
            except Exception:
                log.exception("run %s: could not hand back unstarted jobs", run.id)
        for c in ctxs:
            if not c.settled and not c.in_caller_tx:
                try:
                    await c.fail("the run stopped while the job was running")
                except Exception:
                    log.exception("run %s: could not release job %s", run.id, c.job.id)

    # -- heartbeat and the runs row ----------------------------------------------------

    async def _heartbeat(self, run: RunState) -> None:
        """Refresh the locks of the jobs this run holds and save its progress, every
        ``heartbeat_every`` (well inside the stale window and the platform timeout)."""
        q = self.queue
        while True:
            await asyncio.sleep(self.heartbeat_every.total_seconds())
            try:
                # A handler past its deadline is not covered: if it ignores its
                # cancellation, its job goes stale like a dead run's (docs/design.md,
                # "Handler deadlines").
                now = time.monotonic()
                held = [c.job for c in list(run.held.values())
                        if c.deadline is None or now < c.deadline]
                if run.prefetched is not None and run.prefetched[1].done() \
                        and not run.prefetched[1].cancelled() \
                        and run.prefetched[1].exception() is None:
                    held += run.prefetched[1].result()
                if held:
                    async with q.connection() as c:
                        await q.store.execute("heartbeat", {
                            "ids": [j.id for j in held],
                            "claim_tokens": [j.claim_token for j in held],
                            "offset": q.clock_offset}, conn=c)
                await self._save(run)
            except Exception:
                log.exception("run %s: heartbeat failed", run.id)

    async def _save(self, run: RunState, *, final: bool = False,
                    stop_reason: StopReason | None = None,
                    error: str | None = None) -> datetime | None:
        """Save the run's counters (``final``: and its end); returns ``finished_at``."""
        q = self.queue
        run.saved_at = time.monotonic()
        async with q.connection() as c:
            row = await q.store.fetch_one("run_save", {
                **run.save_params(), "final": final, "stop_reason": stop_reason,
                "error": error, "offset": q.clock_offset}, conn=c)
        return None if row is None else row[0]

    async def _save_end(self, run: RunState, stop: StopReason, error: str | None) -> datetime:
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
            except psycopg.Error as exc:
                if not is_connection_failure(exc):
                    # The row refuses what the run reports: record the end without the
                    # summary rather than leave the run unfinished (docs/design.md,
                    # "Bad data belongs to its job").
                    log.error("run %s: its summary cannot be stored (%s); recording the "
                              "end without it", run.id, first_line(exc, with_type=True))
                    if run.summary == _UNSTORABLE or delay is None:
                        raise
                    run.summary = dict(_UNSTORABLE)
                    continue
                if delay is None:
                    raise
                log.warning("run %s: could not record its end yet; retrying", run.id)
                await asyncio.sleep(delay)
            else:
                assert finished_at is not None, "the run's row disappeared"
                run.ended = True
                return finished_at
        raise AssertionError("unreachable")

    async def _finish_quietly(self, run: RunState, stop: StopReason, error: str) -> None:
        try:
            await self._save(run, final=True, stop_reason=stop, error=error)
            run.ended = True
        except Exception:
            log.exception("run %s: could not record its end", run.id)


def _handler_slots(stage: Stage) -> int:
    """Handler calls of ``stage`` that may hold a connection at once."""
    return 1 if stage.batch_handler is not None else stage.concurrency


async def _no_give_up_hook(job: Job, conn: AnyConn) -> None:
    """The give-up hook of a stage that declares none."""


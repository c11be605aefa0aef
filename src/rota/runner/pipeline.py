"""The pipeline runner: stages, the run loop, the time budget and stop reasons
(docs/design.md, "The runner").

A :class:`Pipeline` is an ordered list of :class:`Stage` objects. One call of
:meth:`Pipeline.run` is one *run* (one row of ``runs``): it claims one batch from the
first stage that has work, runs it with the stage's concurrency, and starts again from
the top, until there is no work, the time budget is spent, or only quota-blocked work is
left. Handlers get a :class:`JobContext`.

One piece (about 530 lines): the loop, the prefetch, the heartbeat, the quota skip and
the runs-row saves all read and write one :class:`RunState` under one time budget, and
their order is the run's correctness (a batch is claimed only after the previous
completion was handed over; unstarted jobs go back before the end is recorded).
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

from ..checks import require_duration
from ..errors import ConfigError, InvalidInput
from ..job import DeferJob, Job
from ..maintenance import Maintainer
from ..queue import AnyConn, Queue
from ..quota import SHARED_SCOPE, Allowance, Quota, QuotaExhausted
from ..schedule import Schedule, Scheduler
from ..settings import DEFAULT_PLATFORM_TIMEOUT, DEFAULT_TIME_BUDGET
from .completer import Completer, error_text, settle_all
from .context import JobContext, RunState
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


class Pipeline:
    """An ordered list of stages run against one queue (docs/design.md, "The runner").

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
        schedules: :class:`rota.Schedule` objects: each run starts by enqueueing their
            due ticks, once across every worker (docs/design.md, "Schedules"); a
            :class:`rota.Worker` wakes in time for the next one. Each one's type must be
            one of the stages'.

    Raises:
        ConfigError: ``queue.stale_after <= platform_timeout`` ("the stale window is safe
            by construction"), duplicate stage types or quota names, a stage's
            ``max_attempts`` that conflicts with the queue's per-type setting, a bad
            heartbeat interval, two schedules with one name, or a schedule whose type no
            stage runs.
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
        schedules: Iterable[Schedule] = (),
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

    async def run(
        self,
        trigger: Trigger = "cron",
        time_budget: timedelta = DEFAULT_TIME_BUDGET,
        *,
        maintenance: Maintainer | None = None,
    ) -> RunResult:
        """Run the pipeline once, inside ``time_budget`` (docs/design.md, "The runner").

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
        run = RunState(uuid.uuid4(), trigger, time_budget)
        q = self.queue
        async with q.connection() as c:
            row = await q.store.fetch_one("run_start", {
                "id": run.id, "trigger": trigger, "offset": q.clock_offset}, conn=c)
        assert row is not None
        started_at: datetime = row[0]
        heartbeat = asyncio.create_task(self._heartbeat(run))
        stop: StopReason
        error: str | None = None
        try:
            if maintenance is not None:
                for k, v in (await maintenance.run_once()).items():
                    run.add(f"maintenance.{k}", v)
            if self.scheduler.schedules:
                for k, v in (await self.scheduler.run_once()).items():
                    if v:
                        run.add(f"schedules.{k}", v)
            stop = await self._loop(run)
        except asyncio.CancelledError:
            await self._finish_quietly(run, "error", "cancelled")
            raise
        except Exception as exc:
            log.exception("run %s ended in error", run.id)
            stop, error = "error", error_text(exc)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        finished_at = await self._save_end(run, stop, error)
        return RunResult(run.id, trigger, stop, run.jobs_done, run.jobs_failed,
                         run.jobs_deferred, run.quota_units, dict(run.summary), error,
                         started_at, finished_at)

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
        completer = Completer(self.queue)
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
        """Save the run's counters after a batch, at most every ``SAVE_EVERY_S``."""
        if time.monotonic() - run.saved_at >= SAVE_EVERY_S:
            await self._save(run)

    async def _call(self, work: Awaitable[None], ctxs: list[JobContext], run: RunState,
                    blocked: list[QuotaExhausted], completer: Completer) -> None:
        """Run one handler call and settle what it left unsettled (jobs it returned
        normally from are handed to ``completer``, which completes them in batches)."""
        for ctx in ctxs:
            ctx.started = True
        try:
            await work
        except DeferJob as exc:
            until = exc.until
            await settle_all(ctxs, lambda c: c.defer(until))
        except QuotaExhausted as exc:
            if exc.scope_key == SHARED_SCOPE:
                blocked.append(exc)
            resets_at = exc.resets_at
            n = await settle_all(ctxs, lambda c: c.defer(resets_at))
            run.add("quota_deferred", n)
        except Exception as exc:
            log.info("job(s) %s raised %s", [c.job.id for c in ctxs], error_text(exc))
            error = exc
            await settle_all(ctxs, lambda c: c.fail(error))
        else:
            completer.add([c for c in ctxs if not c.settled])

    async def _release(self, run: RunState, ctxs: list[JobContext],
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

    async def _heartbeat(self, run: RunState) -> None:
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
            except psycopg.OperationalError:
                if delay is None:
                    raise
                log.warning("run %s: could not record its end yet; retrying", run.id)
                await asyncio.sleep(delay)
            else:
                assert finished_at is not None, "the run's row disappeared"
                return finished_at
        raise AssertionError("unreachable")

    async def _finish_quietly(self, run: RunState, stop: StopReason, error: str) -> None:
        try:
            await self._save(run, final=True, stop_reason=stop, error=error)
        except Exception:
            log.exception("run %s: could not record its end", run.id)


async def _no_give_up_hook(job: Job, conn: AnyConn) -> None:
    """The give-up hook of a stage that declares none."""


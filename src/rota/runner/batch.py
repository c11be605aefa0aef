"""Running one claimed batch (docs/design.md, "The runner" and "Handler deadlines"):
its handlers with the stage's concurrency, each call within its deadline, and every
job settled (completed in group commits, failed, deferred, or handed back as it was).

The run loop (:mod:`.loop`) decides which stage's batch runs and when; a
:class:`BatchRunner` runs the batch it is given and says whether the stage hit its
quota. Every job transition goes through :class:`rota.Queue` (directly, or through the
job's :class:`~rota.runner.context.JobContext`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta

from psycopg_pool import PoolTimeout

from .. import tracing
from ..errors import HandlerTimedOut
from ..job import DeferJob, Job
from ..queue import Queue
from ..quota import SHARED_SCOPE, QuotaExhausted
from ..rates import RateLimited
from . import rates
from .completer import Completer, error_text, settle_all, with_results
from .context import JobContext, QuotaLookup, RateLookup, RunState, retrying
from .stage import Stage

log = logging.getLogger("rota.runner")


@dataclass
class BatchOutcome:
    """How :meth:`BatchRunner.run` left a batch.

    Attributes:
        completing: when every handler ran and none hit the stage's quota (the usual
            case), the completion of the jobs whose handlers returned, not yet awaited,
            so that the loop's next claim overlaps it; ``None`` when everything was
            settled before returning.
        blocked: the stage's shared quota ran out during the batch (the loop skips the
            stage for the rest of the run); its unstarted jobs were handed back.
    """

    completing: Awaitable[None] | None = None
    blocked: QuotaExhausted | None = None


class BatchRunner:
    """Runs claimed batches of one pipeline's stages.

    Args:
        queue: the :class:`rota.Queue` the jobs were claimed from.
        handler_timeout: how long one handler call may run in a stage with no
            ``timeout`` of its own.
        quotas: resolves a quota named in ``ctx.spend("name")`` (``Pipeline.quota``).
        rate_limits: resolves a rate limit named in ``ctx.take("name")``
            (``Pipeline.rate_limit``).
    """

    def __init__(self, queue: Queue, handler_timeout: timedelta,
                 quotas: QuotaLookup, rate_limits: RateLookup | None = None) -> None:
        self.queue = queue
        self.handler_timeout = handler_timeout
        self.quotas = quotas
        self.rate_limits = rate_limits

    def limit(self, stage: Stage) -> float:
        """Seconds one handler call of ``stage`` may run."""
        return (stage.timeout or self.handler_timeout).total_seconds()

    async def run(self, run: RunState, stage: Stage, jobs: list[Job]) -> BatchOutcome:
        """Run one claimed batch's handlers with the stage's concurrency.

        Jobs not started when the budget ends (or once the stage's quota is gone) are
        handed back as they were; jobs started but left unsettled when the batch ends
        in error are failed (retried after backoff).

        Returns:
            A :class:`BatchOutcome`: the completion still to await, or the quota that
            blocked the stage.

        Raises:
            What settling raised (the database failed); the batch's jobs are handed
            back or failed first, as far as the database allows.
        """
        ctxs = [JobContext(j, self.queue, stage, run, self.quotas, self.rate_limits)
                for j in jobs]
        for ctx in ctxs:
            run.held[ctx.job.id] = ctx
        todo = deque(ctxs)
        blocked: list[QuotaExhausted] = []
        completer = Completer(self.queue, run)
        handed_over = False
        # Read once a batch, not once a job: with no SDK and no stored trace context,
        # a handler gets no span at all (rota.tracing; 6 % of a no-op drain's time).
        traced = self.queue.tracer.recording() or any(
            c.job.trace_context is not None for c in ctxs)
        call = self._traced_call if traced else self._call
        try:
            if stage.batch_handler is not None:
                todo.clear()
                going = ctxs
                if stage.limits:  # one unit per job; the refused are deferred
                    going = [c for c in ctxs
                             if await rates.take_for_job(self.queue, run, stage, c)]
                if going:
                    await call(stage.batch_handler(going), going, run, stage, blocked,
                               completer)
            else:
                async def worker() -> None:
                    # After the budget, or once the stage's quota is gone, jobs not yet
                    # started stay in `todo` and are handed back below.
                    while todo and not run.out_of_time() and not blocked:
                        ctx = todo.popleft()
                        if stage.limits and not await rates.take_for_job(
                                self.queue, run, stage, ctx):
                            continue  # deferred until its units are there
                        await call(stage.call(ctx), [ctx], run, stage, blocked,
                                   completer)

                async with asyncio.TaskGroup() as tg:
                    for _ in range(min(stage.concurrency, len(ctxs))):
                        tg.create_task(worker())
            if not blocked and not todo:
                handed_over = True
                return BatchOutcome(completing=self._complete(run, ctxs, completer))
            await completer.wait()
        finally:
            if not handed_over:
                await completer.wait_quietly()
                await self._release(run, ctxs, blocked[0] if blocked else None)
        return BatchOutcome(blocked=blocked[0] if blocked else None)

    async def _complete(self, run: RunState, ctxs: list[JobContext],
                        completer: Completer) -> None:
        """Finish a batch whose handlers all ran: wait for its completions, then hand
        back whatever is still unsettled (as :meth:`run` does inline)."""
        try:
            await completer.wait()
        finally:
            await completer.wait_quietly()
            await self._release(run, ctxs, None)

    async def _traced_call(self, work: Awaitable[object], ctxs: list[JobContext],
                           run: RunState, stage: Stage, blocked: list[QuotaExhausted],
                           completer: Completer) -> None:
        """:meth:`_call` with a span per job (rota.tracing): each ends when its job is
        settled; one handler's is current while it runs, so what it enqueues and logs
        belongs to its trace (a batch handler's jobs may belong to many traces: it runs
        under the run's span)."""
        for ctx in ctxs:
            ctx.span = self.queue.tracer.start_process(ctx.job, run.trace, run.id)
        with tracing.current(ctxs[0].span if len(ctxs) == 1 else None):
            await self._call(work, ctxs, run, stage, blocked, completer)

    async def _call(self, work: Awaitable[object], ctxs: list[JobContext], run: RunState,
                    stage: Stage, blocked: list[QuotaExhausted],
                    completer: Completer) -> None:
        """Run one handler call within its deadline and settle what it left unsettled
        (jobs it returned normally from are handed to ``completer``, which completes
        them in batches).

        The deadline is the stage's timeout from now, or the run's hard deadline when
        that comes first; at it the handler is cancelled and its jobs fail ("timed out
        after N s") and are retried with backoff, unless the run's deadline cut them
        before a timeout that a run has room for: then they go back as they were,
        their attempt returned, counted ``cut_by_run`` (docs/design.md, "Handler
        deadlines")."""
        started = time.monotonic()
        limit = self.limit(stage)
        deadline = min(started + limit, run.hard_deadline)
        # Cut by the run's end before its own timeout, which a whole run has room for:
        # the run ran out of time, not the job (its next run starts it in time).
        run_cut = (started + limit > run.hard_deadline
                   and limit <= run.hard_deadline - run.started_at)
        for ctx in ctxs:
            ctx.started = True
            ctx.deadline = deadline
        loop = asyncio.get_running_loop()
        timer = asyncio.timeout(None)
        at_deadline = self._at_deadline(timer, ctxs, started, limit)
        handle = loop.call_at(loop.time() + (deadline - started), at_deadline)
        failure: Exception | None = None
        value: object = None
        try:
            async with timer:
                value = await work
        except Exception as exc:  # DeferJob and QuotaExhausted included
            failure = exc
        finally:
            handle.cancel()
            at_deadline.cancel()
        # A job completed in the handler's own transaction is done only if that
        # transaction committed (docs/design.md, "Counters show what committed").
        await self._confirm_commits(run, ctxs, failure)
        if timer.expired():
            # A job the handler completed in its own transaction before the cut reached
            # it (its COMMIT landed; the reply came after the deadline) is done, not
            # timed out: only the jobs still unsettled fail and count.
            cut = [c for c in ctxs if not c.settled]
            if cut and run_cut:
                log.warning("job(s) %s: cut by the run's end after %g s, before their "
                            "%g s timeout: handed back as they were",
                            [c.job.id for c in cut], round(deadline - started, 1),
                            round(limit, 1))
                try:
                    await self.hand_back(run, cut, counted="cut_by_run")
                except Exception:  # left held: the batch's end fails them, as a cut
                    log.exception("run %s: could not hand back jobs cut by its end",
                                  run.id)
            elif cut:
                text = f"timed out after {round(deadline - started, 1):g} s"
                log.warning("job(s) %s: %s", [c.job.id for c in cut], text)
                run.add("timed_out", len(cut))
                await settle_all(cut, lambda c: c.fail(text))
        elif failure is None:
            completer.add(await with_results(ctxs, value))
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
            await self.hand_back(run, unsettled, after_run=True)
        else:
            log.info("job(s) %s raised %s", [c.job.id for c in ctxs], error_text(failure))
            if isinstance(failure, HandlerTimedOut):
                run.add("timed_out", len([c for c in ctxs if not c.settled]))
            error = failure
            await settle_all(ctxs, lambda c: c.fail(error))

    def _at_deadline(self, timer: asyncio.Timeout, ctxs: list[JobContext],
                     started: float, limit: float) -> _Deadline:
        """What happens at a handler call's deadline: see :class:`_Deadline`."""
        return _Deadline(timer, ctxs, started + limit, limit)

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

    async def hand_back(self, run: RunState, ctxs: list[JobContext], *,
                        after_run: bool = False, counted: str = "released") -> None:
        """Release claimed jobs as they were: attempts and deferrals unchanged, the due
        time kept (or, ``after_run``, not before this run's budget ends, so it does not
        claim them again) (docs/design.md, "Defer"). Counts them under ``counted`` in
        the summary (``released``: claimed, not started; ``interrupted``: started, cut
        by a stop request; ``cut_by_run``: started, cut by the run's hard deadline
        before their own timeout), and ``lost`` those another run reclaimed
        meanwhile.

        Raises:
            What releasing raised once retries were spent.
        """
        not_before = None
        if after_run and run.time_left() > 0:
            not_before = await self.queue.now() + timedelta(seconds=run.time_left())
        jobs = [c.job for c in ctxs]
        n = await retrying(lambda: self.queue.release(jobs, not_before=not_before), run,
                           "release")
        if not_before is not None:
            # Released jobs keep no claim token; each is due as before when the run
            # ends sooner than its budget.
            run.pushed += [(j.id, None, not_before, j.run_after) for j in jobs
                           if j.run_after < not_before]
        for c in ctxs:
            c.outcome = "released"
            run.held.pop(c.job.id, None)
        run.add(counted, n)
        if n < len(ctxs):  # reclaimed by another run meanwhile
            run.add("lost", len(ctxs) - n)

    async def _hand_back_interrupted(self, run: RunState,
                                     ctxs: list[JobContext]) -> None:
        """Hand back, as they were, the jobs whose handlers a stop request cut (a
        second SIGINT or SIGTERM): counted ``interrupted`` in the summary."""
        cut = [c for c in ctxs if not c.settled and c.started and not c.in_caller_tx
               and not c.abandoned]
        if not cut:
            return
        try:
            await self.hand_back(run, cut, counted="interrupted")
        except Exception:
            log.exception("run %s: could not hand back interrupted jobs", run.id)

    async def _release(self, run: RunState, ctxs: list[JobContext],
                       blocked: QuotaExhausted | None) -> None:
        """Hand back what a batch still holds: jobs never started go back as they were
        (attempts and deferrals unchanged: docs/design.md, "Defer"); when the stage's
        quota is gone, the skip that follows moves them to its reset. Jobs started but
        unsettled (the run is ending in error or cancelled) are failed, so they are
        retried after backoff rather than waiting for the stale window; when the run
        was asked to stop (cancelled by a second signal), they are handed back too,
        their attempt returned: an operator's stop is not the job's failure
        (docs/design.md, "The runner")."""
        if run.stopping():
            await self._hand_back_interrupted(run, ctxs)
        unstarted = [c for c in ctxs if not c.settled and not c.started]
        if unstarted:
            try:
                await self.hand_back(run, unstarted)
            except Exception:
                log.exception("run %s: could not hand back unstarted jobs", run.id)
        for c in ctxs:
            # A job whose thread still runs (a hard stop left it behind at the platform
            # timeout) stays as it is, to the stale-lock rules (docs/design.md,
            # "Handler deadlines").
            if not c.settled and not c.in_caller_tx and not c.abandoned:
                try:
                    await c.fail("the run stopped while the job was running")
                except Exception:
                    log.exception("run %s: could not release job %s", run.id, c.job.id)


class _Deadline:
    """The callback at a handler call's deadline (docs/design.md, "Handler deadlines").
    With no sync call of the handler running in a thread, it cuts the handler (its
    timer expires: the handler is cancelled). A thread cannot be cancelled: while one
    runs, the handler is left running; at the handler's own timeout its jobs are marked
    overdue (:meth:`JobContext.mark_overdue`) and fail once the thread returns; when the
    run's hard deadline came first, it looks again at that timeout.

    Args:
        timer: the call's :func:`asyncio.timeout`, entered around the handler.
        ctxs: the call's jobs.
        own_deadline: the handler's own timeout, on the event loop's monotonic clock.
        limit: that timeout in seconds (for the overdue message).
    """

    def __init__(self, timer: asyncio.Timeout, ctxs: list[JobContext],
                 own_deadline: float, limit: float) -> None:
        self.timer = timer
        self.ctxs = ctxs
        self.own_deadline = own_deadline
        self.limit = limit
        self.later: asyncio.TimerHandle | None = None
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        loop = asyncio.get_running_loop()
        running = [c for c in self.ctxs if c.in_thread]
        if not running:
            self.timer.reschedule(loop.time())  # expires now: the handler is cancelled
            return
        left = self.own_deadline - time.monotonic()
        if left > 0:  # cut by the run's hard deadline first: wait for its own timeout
            self.later = loop.call_at(loop.time() + left, self)
            return
        for c in running:
            c.mark_overdue(self.limit)

    def cancel(self) -> None:
        """The call ended: nothing more happens at its deadline."""
        self.done = True
        if self.later is not None:
            self.later.cancel()

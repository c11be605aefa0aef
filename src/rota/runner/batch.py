"""Running one claimed batch (docs/design.md, "The runner" and "Handler deadlines"):
its handlers with the stage's concurrency, each call within its deadline, and every
job settled (completed in group commits, failed, deferred, or handed back as it was).

The run loop (:mod:`.loop`) decides which stage's batch runs and when; a
:class:`BatchRunner` runs the batch it is given and says whether the stage hit its
quota. How each call ended becomes a settlement (:func:`rota.runner.settle.decide`) that
the run's :class:`~rota.runner.settle.Settler` carries out: this module calls no job
transition itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta

from .. import tracing
from ..job import Job
from ..queue import Queue
from ..quota import QuotaExhausted
from . import rates
from .completer import Completer
from .context import JobContext, QuotaLookup, RateLookup, RunState
from .settle import CallOutcome, Complete, Settler, decide
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
        settler = Settler(self.queue, run)
        ctxs = [JobContext(j, self.queue, stage, run, self.quotas, self.rate_limits,
                           settler=settler) for j in jobs]
        for ctx in ctxs:
            run.held[ctx.job.id] = ctx
        todo = deque(ctxs)
        blocked: list[QuotaExhausted] = []
        completer: Completer[tuple[JobContext, Complete]] = Completer(
            settler.complete_many, run)
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
                             if await rates.take_for_job(settler, stage, c)]
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
                                settler, stage, ctx):
                            continue  # deferred until its units are there
                        await call(stage.call(ctx), [ctx], run, stage, blocked,
                                   completer)

                async with asyncio.TaskGroup() as tg:
                    for _ in range(min(stage.concurrency, len(ctxs))):
                        tg.create_task(worker())
            if not blocked and not todo:
                handed_over = True
                return BatchOutcome(completing=self._complete(settler, ctxs, completer))
            await completer.wait()
        finally:
            if not handed_over:
                await completer.wait_quietly()
                await settler.leftovers(ctxs)
        return BatchOutcome(blocked=blocked[0] if blocked else None)

    async def _complete(self, settler: Settler, ctxs: list[JobContext],
                        completer: Completer[tuple[JobContext, Complete]]) -> None:
        """Finish a batch whose handlers all ran: wait for its completions, then hand
        back whatever is still unsettled (as :meth:`run` does inline)."""
        try:
            await completer.wait()
        finally:
            await completer.wait_quietly()
            await settler.leftovers(ctxs)

    async def _traced_call(self, work: Awaitable[object], ctxs: list[JobContext],
                           run: RunState, stage: Stage, blocked: list[QuotaExhausted],
                           completer: Completer[tuple[JobContext, Complete]]) -> None:
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
                    completer: Completer[tuple[JobContext, Complete]]) -> None:
        """Run one handler call within its deadline, then settle what it left unsettled
        by how it ended: :func:`~rota.runner.settle.decide` says what happens, the
        run's :class:`~rota.runner.settle.Settler` does it (jobs it returned normally
        from go to ``completer``, which completes them in batches).

        The deadline is the stage's timeout from now, or the run's hard deadline when
        that comes first; at it the handler is cancelled (docs/design.md, "Handler
        deadlines")."""
        started = time.monotonic()
        limit = self.limit(stage)
        deadline = min(started + limit, run.hard_deadline)
        # Cut by the run's end before its own timeout, which a whole run has room for:
        # the run ran out of time, not the job (its next run starts it in time).
        run_cut = (started + limit > run.hard_deadline
                   and limit <= run.hard_deadline - run.started_at)
        loop = asyncio.get_running_loop()
        began = loop.time()
        for ctx in ctxs:
            ctx.started = True
            ctx.deadline = deadline
            ctx.started_mono, ctx.call_size = began, len(ctxs)  # for cost="seconds"
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
        # The call's run time, shared evenly by its jobs: what a stage with
        # cost="seconds" charges (docs/design.md, "Cost").
        share = (loop.time() - began) / len(ctxs)
        for ctx in ctxs:
            ctx.seconds = share
        settler = Settler(self.queue, run)
        # A job completed in the handler's own transaction is done only if that
        # transaction committed (docs/design.md, "Counters show what committed"); one
        # whose COMMIT landed before a cut reached it is done, not timed out.
        await settler.confirm_commits(ctxs, failure)
        settlement = decide(CallOutcome(
            failure=failure, value=value, timed_out=timer.expired(), run_cut=run_cut,
            seconds=deadline - started, limit=limit,
            unsettled=sum(not c.settled for c in ctxs),
            pool_timed_out=any(c.pool_timed_out for c in ctxs)))
        await settler.apply(settlement, ctxs, complete=completer.add, blocked=blocked,
                            stage=stage)

    def _at_deadline(self, timer: asyncio.Timeout, ctxs: list[JobContext],
                     started: float, limit: float) -> _Deadline:
        """What happens at a handler call's deadline: see :class:`_Deadline`."""
        return _Deadline(timer, ctxs, started + limit, limit)


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

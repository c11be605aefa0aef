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
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from .. import tracing
from ..job import Job
from ..queue import Queue
from ..quota import QuotaExhausted
from . import rates, recording
from .batching import BatchSize
from .completer import Completer
from .context import JobContext, QuotaLookup, RateLookup, RunState
from .settle import CallOutcome, Complete, Settler, decide
from .stage import Stage

log = logging.getLogger("rota.runner")

#: Seconds a refilling batch's free slot waits for half the slots to be free before it
#: claims alone, and how long a handler must have run before the batch refills around
#: it (docs/design.md, "The runner", "Refill"): about five times what a claim costs
#: (2-4 ms), so a slot is never left idle long behind a slow handler, claims of one or
#: two jobs come at most every 20 ms, never once per finished job, and a batch of fast
#: handlers ends as it did (the loop's next claim, sized by BatchSize, follows).
REFILL_WAIT = 0.02

#: A handler is slow enough for the batch to refill around it once it has run this many
#: times the mean run time of the batch's handlers that returned (and REFILL_WAIT).
STRAGGLER = 4


@dataclass(frozen=True)
class Refill:
    """What a batch needs to claim more of its stage while it runs (docs/design.md,
    "The runner", "Refill"); the run loop gives it for a stage whose next claim it would
    make anyway.

    Attributes:
        claim: claims up to ``n`` more jobs of the stage for the run and returns them
            (``[]``: the stage has no more work now); the loop's own claim, which
            counts unreadable rows (:meth:`RunLoop._claim`) and hands over a batch
            prefetched for the stage first.
        size: the stage's current claim size in jobs (:meth:`RunLoop.batch_size`): the
            batch refills only when its own claim came back that full.
        progress: saves the run's counters (:meth:`RunRecorder.save_progress`): a
            refilled batch may last the whole run, so it saves them every
            ``SAVE_EVERY_S`` while it runs rather than only at its end.

    A refill asks for ``min(size, max(idle, round(idle * per_slot)))`` jobs:
    ``per_slot`` is what one slot handles in one claim, ``size / concurrency``, or, when
    more, what it handles in :attr:`BatchSize.FAST` seconds at the mean run time of the
    batch's handlers so far; never more than the loop's own claim would take (the
    stage's fixed ``batch``, else at most :attr:`BatchSize.MAX`). The mean only counts handlers
    that returned, so with a few slow handlers among fast ones it says the work is
    faster than it is: capped at ``size``, a refill holds no more than a batch of the
    loop would.
    """

    claim: Callable[[int], Awaitable[list[Job]]]
    size: int
    progress: Callable[[], Awaitable[None]] | None = None


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
        claimed: jobs the batch held in all: its claim plus what its refills claimed.
    """

    completing: Awaitable[None] | None = None
    blocked: QuotaExhausted | None = None
    claimed: int = 0


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

    async def run(self, run: RunState, stage: Stage, jobs: list[Job],
                  refill: Refill | None = None) -> BatchOutcome:
        """Run one claimed batch's handlers with the stage's concurrency.

        Jobs not started when the budget ends (or once the stage's quota is gone) are
        handed back as they were; jobs started but left unsettled when the batch ends
        in error are failed (retried after backoff).

        With ``refill`` (a stage of one-job handlers whose next claim the loop would make
        anyway) and a claim that came back full, slots left free behind a slower handler
        are fed by more claims of the stage (:class:`_Slots`; docs/design.md, "Refill");
        their jobs join the batch and are settled, handed back or failed as its own.

        Returns:
            A :class:`BatchOutcome`: the completion still to await, or the quota that
            blocked the stage, and how many jobs the batch held in all.

        Raises:
            What settling raised (the database failed); the batch's jobs are handed
            back or failed first, as far as the database allows.
        """
        settler = Settler(self.queue, run)
        ctxs: list[JobContext] = []
        todo: deque[JobContext] = deque()
        # Read once a claim, not once a job: with no SDK and no stored trace context,
        # a handler gets no span at all (rota.tracing; 6 % of a no-op drain's time).
        traced = self.queue.tracer.recording()

        def take(claimed: list[Job]) -> None:
            """Claimed jobs join the batch: held by the run (heartbeats, hand-back at
            its end, cut-offs) and queued for the slots."""
            nonlocal traced
            new = [JobContext(j, self.queue, stage, run, self.quotas, self.rate_limits,
                              settler=settler) for j in claimed]
            for ctx in new:
                run.held[ctx.job.id] = ctx
            ctxs.extend(new)
            todo.extend(new)
            traced = traced or any(c.job.trace_context is not None for c in new)

        take(jobs)
        blocked: list[QuotaExhausted] = []
        completer: Completer[tuple[JobContext, Complete]] = Completer(
            settler.complete_many, run)
        handed_over = False
        slots: _Slots | None = None
        try:
            if stage.batch_handler is not None:
                call = self._traced_call if traced else self._call
                todo.clear()
                going = ctxs
                if stage.limits:  # one unit per job; the refused are deferred
                    going = [c for c in ctxs
                             if await rates.take_for_job(settler, stage, c)]
                if going:
                    await call(stage.batch_handler(going), going, run, stage, blocked,
                               completer)
            else:
                async def run_one(ctx: JobContext) -> None:
                    if stage.limits and not await rates.take_for_job(settler, stage, ctx):
                        return  # deferred until its units are there
                    call = self._traced_call if traced else self._call
                    await call(stage.call(ctx), [ctx], run, stage, blocked, completer)

                if refill is not None and (stage.concurrency == 1
                                           or len(jobs) < refill.size):
                    refill = None  # no slot to free, or the backlog was drained
                slots = _Slots(stage.concurrency, todo, run, blocked, run_one, refill, take)
                await slots.run()
            if not blocked and not todo:
                handed_over = True
                return BatchOutcome(completing=self._complete(settler, ctxs, completer),
                                    claimed=len(ctxs))
            await completer.wait()
        finally:
            if slots is not None:  # a refill claim in flight joins the batch first
                await slots.landed()
            if not handed_over:
                await completer.wait_quietly()
                await settler.leftovers(ctxs)
        return BatchOutcome(blocked=blocked[0] if blocked else None, claimed=len(ctxs))

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


class _Slots:
    """The handler slots of one batch of a one-job handler stage: up to ``concurrency``
    workers pop jobs from ``todo`` until it is empty, the budget is spent (or the run
    asked to stop) or the stage's quota is gone; jobs left in ``todo`` are the batch's
    to hand back.

    With a :class:`Refill`, free slots are fed by more claims of the stage while slower
    handlers still run (docs/design.md, "Refill"): once ``todo`` is empty, a handler
    has run for ``REFILL_WAIT`` seconds and ``STRAGGLER`` times the mean run time of the
    batch's handlers that returned, and at least half the slots are free or one has
    been free for ``REFILL_WAIT``, one claim (never two at once) sized as
    :class:`Refill` says; new workers take its jobs. Refilling stops for good after the
    budget, once the stage is blocked, when a claim comes back short of what it asked
    (the stage has no more work now) or fails (logged: the loop's next claim meets it),
    and when no handler runs any more (the batch ends; the loop claims next). The run's
    progress is saved every ``SAVE_EVERY_S`` while the batch runs (``Refill.progress``).

    Args:
        concurrency: the stage's concurrency, > 0.
        todo: the batch's jobs not yet started (refills append to it).
        run: the run (its budget and stop request).
        blocked: the batch's shared quota that ran out, if any.
        run_one: runs one job's handler and settles it.
        refill: how to claim more, or ``None``.
        take: adds claimed jobs to the batch (its contexts, the run's held jobs, ``todo``).
    """

    def __init__(self, concurrency: int, todo: deque[JobContext], run: RunState,
                 blocked: list[QuotaExhausted],
                 run_one: Callable[[JobContext], Awaitable[None]],
                 refill: Refill | None, take: Callable[[list[Job]], None]) -> None:
        self.concurrency = concurrency
        self.todo = todo
        self.run_state = run
        self.blocked = blocked
        self.run_one = run_one
        self.refill = refill
        self.take = take
        self.live = 0  # workers started and not yet returned
        self.ran = 0  # handler calls returned, and their seconds in all
        self.ran_s = 0.0
        # When each running handler started (monotonic), by worker.
        self.running: dict[int, float] = {}
        self.refilling = False  # the refiller still runs
        self.ended = asyncio.Event()  # no worker, and the refiller ended: the batch ends
        self.changed = asyncio.Event()  # a worker returned
        self.claiming: asyncio.Task[int] | None = None
        self.group: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        """Run the batch's jobs (and its refills') to the end.

        Raises:
            What a handler's settling raised (in an exception group, as the task group
            raises it); the other workers are cancelled.
        """
        async with asyncio.TaskGroup() as group:
            self.group = group
            self._start_workers()
            if self.refill is not None:
                self.refilling = True
                group.create_task(self._refiller(self.refill))
                if self.refill.progress is not None:
                    group.create_task(self._saver(self.refill.progress))

    async def landed(self) -> None:
        """Wait for a refill claim still in flight (the batch ended or was cancelled
        meanwhile), so that its jobs join the batch and are handed back with its
        leftovers rather than left locked until stale."""
        if self.claiming is not None and not self.claiming.done():
            await asyncio.wait({self.claiming})

    def _start_workers(self) -> None:
        assert self.group is not None
        for _ in range(min(self.concurrency - self.live, len(self.todo))):
            self.live += 1
            self.group.create_task(self._worker())

    async def _worker(self) -> None:
        run = self.run_state
        me = id(asyncio.current_task())
        try:
            # After the budget, or once the stage's quota is gone, jobs not yet
            # started stay in `todo` and are handed back by the batch.
            while self.todo and not run.out_of_time() and not self.blocked:
                started = self.running[me] = time.monotonic()
                try:
                    await self.run_one(self.todo.popleft())
                finally:
                    del self.running[me]
                self.ran += 1
                self.ran_s += time.monotonic() - started
        finally:
            self.live -= 1
            self.changed.set()
            self._maybe_ended()

    def _maybe_ended(self) -> None:
        if self.live == 0 and not self.refilling:
            self.ended.set()

    async def _saver(self, progress: Callable[[], Awaitable[None]]) -> None:
        """Save the run's progress every ``SAVE_EVERY_S`` until the batch ends (no
        worker left and the refiller done)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), recording.SAVE_EVERY_S)
            if self.ended.is_set():
                return
            await progress()

    async def _refiller(self, refill: Refill) -> None:
        try:
            await self._refill(refill)
        finally:
            self.refilling = False
            self._maybe_ended()

    async def _refill(self, refill: Refill) -> None:
        run = self.run_state
        half = max(1, self.concurrency // 2)
        idle_since: float | None = None  # when a slot went free with `todo` empty
        while True:
            self.changed.clear()
            if self.live == 0 or run.out_of_time() or self.blocked:
                return
            idle = self.concurrency - self.live
            if not idle or self.todo:
                idle_since = None
                await self.changed.wait()
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            # Only around a handler that has run a while, and longer than the batch's
            # handlers take: a batch of fast handlers ends as it did, and the loop's
            # next claim (BatchSize) follows, also on a machine so loaded that every
            # handler takes 20 ms.
            slowest = now - min(self.running.values(), default=now)
            wait = max(REFILL_WAIT, STRAGGLER * self.ran_s / self.ran if self.ran else 0)
            if slowest < wait:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), wait - slowest)
                continue
            if idle >= half or now - idle_since >= REFILL_WAIT:
                n = self._refill_size(refill, idle)
                self.claiming = asyncio.get_running_loop().create_task(
                    self._claim(refill, n))
                # Shielded: cancelling the batch must not drop a claim the database
                # may have made; landed() waits for it.
                got = await asyncio.shield(self.claiming)
                if run.out_of_time() or self.blocked:
                    return  # its jobs, if any, are in `todo`: the batch hands them back
                self._start_workers()
                if got < n:
                    return  # the stage has no more work now
                idle_since = None
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(),
                                       idle_since + REFILL_WAIT - now)

    def _refill_size(self, refill: Refill, idle: int) -> int:
        """Jobs a refill asks for ``idle`` free slots (see :class:`Refill`)."""
        per_slot = refill.size / self.concurrency
        if self.ran and self.ran_s > 0:
            per_slot = max(per_slot, BatchSize.FAST * self.ran / self.ran_s)
        return min(refill.size, max(idle, round(idle * per_slot)))

    async def _claim(self, refill: Refill, n: int) -> int:
        """One refill claim of up to ``n`` jobs; its jobs join the batch as soon as it
        returns, whoever still waits for it.

        Returns:
            How many jobs it claimed; 0 when it failed (logged).
        """
        try:
            jobs = await refill.claim(n)
        except Exception as exc:
            log.warning("run %s: a refill claim failed, refilling stops for this batch:"
                        " %s", self.run_state.id, exc)
            return 0
        self.take(jobs)
        return len(jobs)

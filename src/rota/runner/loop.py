"""The run loop (docs/design.md, "The runner"): which stage's batch is claimed next,
the time budget, the hard deadline, and why the run stopped.

One :meth:`RunLoop.run` is one run: its row is started (:class:`.recording.RunRecorder`),
maintenance and the schedules go first, then the loop claims one batch from the first
stage that has work (and is not blocked by its quota), has it run
(:class:`.batch.BatchRunner`, which refills its free slots with more claims of its
stage where that claim is the loop's next anyway: docs/design.md, "Refill"), and
starts again from the top, until there is no work,
the budget is spent, or only quota-blocked work is left. Its order is the run's
correctness: a batch is claimed only after the previous completion was handed over;
unstarted jobs go back before the end is recorded; nothing outlives the hard deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Sequence
from datetime import timedelta

from .. import tracing
from ..errors import UnreadableJob
from ..job import Job
from ..maintenance import Maintainer
from ..queue import Queue
from ..quota import SHARED_SCOPE, Quota, QuotaExhausted
from ..schedule import Scheduler
from . import rates
from .batch import BatchRunner, Refill
from .batching import BatchSize
from .completer import error_text
from .context import RunState
from .recording import RunRecorder
from .settle import Settler
from .stage import RunResult, Stage, StopReason, Trigger

log = logging.getLogger("rota.runner")


class RunOverran(Exception):
    """The run was still busy at its hard deadline (a handler ignored its cancellation,
    or the database stopped answering): it was cut, its jobs settled, and it ended in
    error."""


class RunLoop:
    """The loop of one pipeline's runs.

    Args:
        queue: the :class:`rota.Queue`.
        stages: in runner order (earlier stages win).
        scheduler: the pipeline's schedules, run at the start of each run.
        batches: runs each claimed batch.
        recorder: writes the runs row and beats the heartbeat.
        hard_limit: from a run's start to its hard deadline (the platform timeout less
            the settle reserve): every handler is cut by then.
        settle_reserve: the part of the platform timeout kept for settling after the
            hard deadline.
        sizes: claim sizes of the stages whose batch the runner chooses, by type, kept
            across runs (the pipeline's; filled here).
        connections: connections the stages and the runner need at once: the queue's
            own pool is grown to that at the start of a run (docs/design.md,
            "Connections").
    """

    def __init__(self, queue: Queue, stages: Sequence[Stage], *, scheduler: Scheduler,
                 batches: BatchRunner, recorder: RunRecorder, hard_limit: timedelta,
                 settle_reserve: timedelta, sizes: dict[str, BatchSize],
                 connections: int) -> None:
        self.queue = queue
        self.stages = tuple(stages)
        self.scheduler = scheduler
        self.batches = batches
        self.recorder = recorder
        self.hard_limit = hard_limit
        self.settle_reserve = settle_reserve
        self.sizes = sizes
        self.connections = connections

    def batch_size(self, stage: Stage) -> int:
        """The size of ``stage``'s next claim: its ``batch``, or when that is ``None``
        the size the runner has settled on (:class:`~rota.runner.batching.BatchSize`)."""
        if stage.batch is not None:
            return stage.batch
        return self.sizes.setdefault(stage.type, BatchSize(stage.concurrency)).size

    async def run(self, trigger: Trigger, time_budget: timedelta, *,
                  maintenance: Maintainer | None = None,
                  stop: asyncio.Event | None = None,
                  trace: tracing.RunTrace | None = None) -> RunResult:
        """One run (the caller checked ``trigger`` and ``time_budget``); see
        :meth:`rota.Pipeline.run` for the rules, the result and what it raises.
        ``trace``: the run's span (:meth:`rota.tracing.Tracer.run`), if any."""
        run = RunState(uuid.uuid4(), trigger, time_budget, self.hard_limit, stop,
                       self.hard_limit + self.settle_reserve)
        if trace is not None:
            run.trace = trace
            trace.started(run.id)
        started_at = await self.recorder.start(run)
        pool_size = self.queue.pool.max_size
        if await self.queue.ensure_pool_size(self.connections):
            log.info("grew the queue's pool from %d to %d connections for %s", pool_size,
                     self.connections, ", ".join(s.type for s in self.stages))
        heartbeat = asyncio.create_task(self.recorder.heartbeat(run))
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
            # Ended sooner than its budget too: what it deferred is due as asked.
            await self._restore_due_times(run)
            if run.stopping():  # a second stop request: its jobs were handed back
                await self.recorder.finish_quietly(run, "interrupted", None)
            else:
                await self.recorder.finish_quietly(run, "error", "cancelled")
            raise
        except RunOverran as exc:  # said and settled in _within_deadline: no traceback
            log.error("run %s ended in error: %s", run.id, exc)
            reason, error = "error", error_text(exc)
        except Exception as exc:
            log.exception("run %s ended in error", run.id)
            reason, error = "error", error_text(exc)
        finally:
            await self.recorder.stop_heartbeat(heartbeat)
        await self._restore_due_times(run)
        finished_at = await self.recorder.save_end(run, reason, error)
        # Jobs that failed an attempt and will be retried (a handler timed out, say)
        # are neither done nor failed: said when there are some, or the line read as if
        # the run had touched nothing.
        retried = run.summary.get("retries", 0)
        log.info("run %s (%s) stopped %s: %d done, %d failed, %d deferred%s%s", run.id,
                 trigger, reason, run.jobs_done, run.jobs_failed, run.jobs_deferred,
                 f", {retried} retried" if retried else "", f": {error}" if error else "")
        return RunResult(run.id, trigger, reason, run.jobs_done, run.jobs_failed,
                         run.jobs_deferred, run.quota_units, dict(run.summary), error,
                         started_at, finished_at)

    async def _restore_due_times(self, run: RunState) -> None:
        """The run has ended: the jobs whose due time it pushed to its budget's end are
        due as asked again, so a worker's next run takes them on time (docs/design.md,
        "Defer"); a cancelled run's too (a second stop request). When the database
        cannot say so, they stay due at the budget's end: late, never lost."""
        await Settler(self.queue, run).restore_due_times()

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
            while True:
                await asyncio.wait({task}, timeout=max(cut_at - time.monotonic(), 0.0))
                if task.done() or not run.threads():
                    break
                # A thread cannot be cancelled: the run waits for its sync handlers
                # rather than let their jobs run twice (docs/design.md, "Handler
                # deadlines"), then gives the rest the usual grace.
                log.warning("run %s: past its hard deadline, waiting for %d sync "
                            "handler(s) still running in threads", run.id,
                            len(run.threads()))
                await run.threads_returned()
                cut_at = time.monotonic() + grace
        except asyncio.CancelledError:
            run.cancelled = True
            task.cancel()
            # Handlers running in threads wait for them until the platform deadline
            # (JobContext.to_thread), then let the cancellation through.
            wait = grace
            if run.threads():
                wait += max(run.platform_deadline - time.monotonic(), 0.0)
            await asyncio.wait({task}, timeout=wait)
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
        # A job whose thread still runs (a hard stop left it behind) is left as it is,
        # to the stale-lock rules: failing it would let another worker start it while
        # the thread goes on (docs/design.md, "Handler deadlines").
        held = [c for c in list(run.held.values())
                if not c.settled and not c.in_thread and not c.abandoned]
        log.error("run %s: cut at its hard deadline; settling %d jobs it left behind",
                  run.id, len(held))
        await Settler(self.queue, run).cut_off(held)

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
                # After the budget, or once asked to stop, no new batch is claimed.
                if run.out_of_time():
                    return "interrupted" if run.stopping() else "time_budget"
                if stage.type in run.skipped or rates.waiting(run, stage):
                    continue
                if stage.quota is not None:
                    block = await self._quota_block(stage.quota, stage.quota_cost)
                    if block is not None:
                        await self._skip(run, stage, block)
                        continue
                if run.prefetched is not None and run.prefetched[0] == stage.type:
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
                            await asyncio.shield(Settler(self.queue, run).release(jobs))
                    raise
                if not jobs:
                    continue
                claims_next = self._claims_next(run, i)
                if stage.prefetch and claims_next:
                    run.prefetched = (stage.type, asyncio.get_running_loop().create_task(
                        self._claim(run, stage)))
                refill = None
                if stage.refill and claims_next and stage.batch_handler is None:
                    refill = Refill(functools.partial(self._refill_claim, run, stage),
                                    self.batch_size(stage),
                                    functools.partial(self.recorder.save_progress, run))
                started = time.monotonic()
                outcome = await self.batches.run(run, stage, jobs, refill)
                sizer = self.sizes.get(stage.type)
                if sizer is not None:  # what the batch ran, refills included
                    sizer.observe(outcome.claimed, time.monotonic() - started)
                if outcome.completing is not None:
                    run.finishing = asyncio.get_running_loop().create_task(
                        self._complete_and_save(run, outcome.completing))
                else:
                    if outcome.blocked is not None:
                        await self._skip(run, stage, outcome.blocked)
                    await self.recorder.save_progress(run)
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

    def _claims_next(self, run: RunState, i: int) -> bool:
        """Whether a claim of ``self.stages[i]`` while its batch runs is the claim the
        loop would make next anyway, so making it early changes no order: no quota to
        check before each claim, no rate limits to wait for, and every earlier stage
        skipped for the run (earlier stages win). A prefetch and a refill are made only
        then (docs/design.md, "The runner", "Refill")."""
        stage = self.stages[i]
        return (stage.quota is None and not stage.limits
                and all(s.type in run.skipped for s in self.stages[:i]))

    async def _refill_claim(self, run: RunState, stage: Stage, n: int) -> list[Job]:
        """A refill claim for ``stage``'s running batch (docs/design.md, "Refill"): the
        batch prefetched for the stage, when there is one (claimed for its next batch:
        the free slots start it now rather than hold it); else a claim of at most ``n``
        jobs (the batch sized it: :class:`~rota.runner.batch.Refill`).

        Raises:
            What the claim (or the prefetching claim) raised.
        """
        if run.prefetched is not None and run.prefetched[0] == stage.type:
            task = run.prefetched[1]
            run.prefetched = None
            # Never short of what the slots asked: a refill asks at most the stage's
            # claim size (Refill), what the prefetch claimed. Fewer: the stage had no
            # more, and refilling stops.
            return await task
        return await self._claim(run, stage, size=n)

    async def _complete_and_save(self, run: RunState, completing: Awaitable[None]) -> None:
        """A batch's completion, then the run's progress saved (the loop awaits it after
        its next claim, so that claim and this completion overlap)."""
        await completing
        await self.recorder.save_progress(run)

    async def _claim(self, run: RunState, stage: Stage, room: int | None = None, *,
                     size: int | None = None) -> list[Job]:
        """Claim a batch of ``stage``: ``size`` jobs (default its claim size,
        :meth:`batch_size`), at most ``room`` (what its rate limits let start soon);
        rows that cannot be read were given up by the claim and count as failed here
        (docs/design.md, "Bad data belongs to its job")."""
        if size is None:
            size = self.batch_size(stage)
        if room is not None:
            size = min(size, room)
        return await self.queue.claim(stage.type, size, run_id=run.id,
                                      unreadable=_CountedUnreadable(Settler(self.queue, run)))

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
            await Settler(self.queue, run).release(jobs, "prefetch_released")

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
        before the reset), wait for the reset as pending (:meth:`rota.Queue.postpone`).
        Work left waiting for it makes the run's stop reason a quota one."""
        run.skipped.add(stage.type)
        await Settler(self.queue, run).postpone(stage.type, block.resets_at, "postponed")
        if await self.queue.has_pending_by(stage.type, block.resets_at):
            run.blocked.add(block.reason)
        log.info("run %s: stage %r skipped: %s", run.id, stage.type, block)


def handler_slots(stage: Stage) -> int:
    """Handler calls of ``stage`` that may hold a connection at once."""
    return 1 if stage.batch_handler is not None else stage.concurrency


class _CountedUnreadable(list[UnreadableJob]):
    """The list a claim puts each row it gave up in (:meth:`rota.Queue.claim`'s
    ``unreadable``), counting it in the run as it is put there: the give-up has
    committed by then, so it counts even when the claim goes no further (cut at the
    run's hard deadline, or a prefetch or refill claim the run stopped waiting for,
    while its database did not answer: counted when the claim returned, such rows were
    failed by the run and missing from its summary)."""

    def __init__(self, settler: Settler) -> None:
        super().__init__()
        self._settler = settler

    def append(self, item: UnreadableJob) -> None:
        super().append(item)
        self._settler.unreadable(1)


__all__ = ["RunLoop", "RunOverran", "handler_slots"]

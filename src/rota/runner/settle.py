"""Settling a job: the one path (docs/design.md, "The runner", "Settling twice",
"Counters show what committed").

Two halves, as oban-py's executor returns an action its producer acknowledges:

- :func:`decide`, a pure function: how a handler call ended (:class:`CallOutcome`:
  returned, raised, cut at its deadline, cut by the run's end, starved of a
  connection) to what happens to its jobs (a :data:`Settlement`: :class:`Complete`,
  :class:`Fail`, :class:`Defer`, :class:`WaitForRate`, :class:`HandBack`,
  :class:`Keep`). No database, no clock: its tests list every outcome.
- :class:`Settler`, the only runner code that calls the queue's job transitions
  (complete, complete_many, fail, defer, release, restore_due_times, postpone,
  claim_states) and writes the run's settling counters (``jobs_done``,
  ``jobs_failed``, ``jobs_deferred`` and the summary's ``released``, ``lost``,
  ``retries``, ``timed_out``…). The handler's ``ctx.complete``/``fail``/``defer``, the
  batch runner, the run loop and the runner's rate limits all settle through it.

A settlement whose connection fails is sent again (:func:`retrying`): repeated under
the same claim it answers what the first did, so telling "lost" from "already settled
by this claim" is the queue's ``claim_states``, read here only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from psycopg_pool import PoolTimeout

from .. import tracing
from ..errors import HandlerTimedOut, first_line
from ..job import DeferJob, FailOutcome, Job, due_or_delay
from ..queue import AnyConn, Queue
from ..quota import SHARED_SCOPE, QuotaExhausted
from ..rates import NO_KEY, RateLimit, RateLimited, note_rate_waits
from ..results import ResultError, encode_result
from ..store import is_connection_failure
from .completer import error_text
from .context import JobContext, Outcome, RunState
from .stage import Stage

log = logging.getLogger("rota.runner")
T = TypeVar("T")

# Waits between attempts of a settlement (complete, fail, defer, release) whose
# connection failed: repeated under the same claim it answers what the first one did
# (docs/design.md, "Settling twice"), so retrying is safe. About 3.5 s in all.
_SETTLE_RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0)
#: From this many deferrals on, a job deferred for a rate is reported as deferred again
#: and again (a warning naming the limit and the stage, the counter
#: ``rate.NAME.repeated``; docs/design.md, "Rates").
REPEATED_DEFERRALS = 10


# -- what happens to a job ---------------------------------------------------------

@dataclass(frozen=True)
class Complete:
    """Complete the jobs (done), each with its result: a one-job handler's return
    ``value`` becomes its job's result (a batch handler sets ``ctx.result`` itself);
    a value that cannot be stored fails its job, given up (docs/design.md, "Results").

    Attributes:
        value: what the handler returned (``None``: no result). Each job's cost is its
            context's (:attr:`rota.JobContext.cost`: what it charged, or its run time
            for a stage charging seconds; docs/design.md, "Cost").
    """

    value: object = None


@dataclass(frozen=True)
class Fail:
    """Record a failed attempt: retried after backoff, or failed (give-up hook owed)
    once attempts are used up (docs/design.md, "Fail and backoff").

    Attributes:
        error: the exception, or the error text, kept as the job's error.
        count: a summary counter that takes the number of jobs failed (``timed_out``).
        give_up: failed at once, whatever the attempts left.
        warn: logged as a warning (a timeout) rather than as information (a raise).
    """

    error: BaseException | str
    count: str | None = None
    give_up: bool = False
    warn: bool = False


@dataclass(frozen=True)
class Defer:
    """Put the jobs back without burning an attempt, due at ``until`` (an aware instant,
    a delay from the queue's clock, ``None``: at once), never within this run
    (docs/design.md, "Defer").

    Attributes:
        until: when the jobs are due.
        count: a summary counter that takes the number of jobs deferred
            (``quota_deferred``).
        blocks: the shared quota whose exhaustion also skips the stage for the rest
            of the run (docs/design.md, "Quotas").
    """

    until: datetime | timedelta | None
    count: str | None = None
    blocks: QuotaExhausted | None = None


@dataclass(frozen=True)
class WaitForRate:
    """Defer the jobs until their rate limit's units are there, ``limited.free_at``
    (docs/design.md, "Rates")."""

    limited: RateLimited


@dataclass(frozen=True)
class HandBack:
    """Release the jobs as they were: attempt returned, no deferral counted
    (docs/design.md, "Defer").

    Attributes:
        count: the summary counter of the jobs handed back (``released``,
            ``cut_by_run``, ``interrupted``).
        after_run: not due again before this run's budget ends.
        also: a further counter that takes the number of jobs (``pool_timeouts``).
        why: logged (a warning) before handing back.
        best_effort: a failure to hand back is logged, not raised (the batch's end
            fails the jobs left held).
    """

    count: str = "released"
    after_run: bool = False
    also: str | None = None
    why: str = ""
    best_effort: bool = False


@dataclass(frozen=True)
class Keep:
    """Nothing left to settle: the handler settled every job itself."""


#: What happens to a handler call's unsettled jobs.
Settlement = Complete | Fail | Defer | WaitForRate | HandBack | Keep


@dataclass(frozen=True)
class CallOutcome:
    """How one handler call ended, as :func:`decide` reads it.

    Attributes:
        failure: what the handler raised (``None``: it returned).
        value: what it returned.
        timed_out: its deadline passed and it was cut.
        run_cut: that deadline was the run's hard deadline, before the handler's own
            timeout, which a whole run has room for.
        seconds: how long it ran until its deadline (rounded to 0.1 s in the texts).
        limit: its own timeout, seconds.
        unsettled: how many of its jobs are still unsettled (after the jobs it
            completed in its own transaction were read back).
        pool_timed_out: one of its jobs got no connection from rota's pool.
    """

    failure: Exception | None = None
    value: object = None
    timed_out: bool = False
    run_cut: bool = False
    seconds: float = 0.0
    limit: float = 0.0
    unsettled: int = 1
    pool_timed_out: bool = False


def decide(outcome: CallOutcome) -> Settlement:
    """What happens to a handler call's unsettled jobs (docs/design.md, "The runner",
    "Handler deadlines", "Defer", "Quotas", "Rates", "Connections"). Pure: same
    outcome, same settlement.

    - cut at its deadline: nothing when it settled every job; handed back as they were
      (``cut_by_run``) when the run's end cut it before a timeout a run has room for;
      else failed, "timed out after N s" (``timed_out``);
    - returned: completed, with its value as the result;
    - raised ``DeferJob``: deferred to its ``until``;
    - raised ``QuotaExhausted``: deferred to the reset (``quota_deferred``), and a
      shared quota skips the stage;
    - raised ``RateLimited``: deferred until the units are there;
    - raised ``PoolTimeout`` for rota's own pool: handed back, due after this run
      (``pool_timeouts``);
    - raised anything else: failed with it (``HandlerTimedOut``: counted ``timed_out``).
    """
    failure = outcome.failure
    if outcome.timed_out:
        if outcome.unsettled == 0:
            return Keep()
        seconds = round(outcome.seconds, 1)
        if outcome.run_cut:
            # The run ran out of time, not the job: its next run starts it in time.
            return HandBack(count="cut_by_run", best_effort=True, why=(
                f"cut by the run's end after {seconds:g} s, before their "
                f"{round(outcome.limit, 1):g} s timeout: handed back as they were"))
        return Fail(f"timed out after {seconds:g} s", count="timed_out", warn=True)
    if failure is None:
        return Complete(outcome.value)
    if isinstance(failure, DeferJob):
        return Defer(failure.until)
    if isinstance(failure, QuotaExhausted):
        return Defer(failure.resets_at, count="quota_deferred",
                     blocks=failure if failure.scope_key == SHARED_SCOPE else None)
    if isinstance(failure, RateLimited):
        return WaitForRate(failure)
    if isinstance(failure, PoolTimeout) and outcome.pool_timed_out:
        # rota's pool had no connection for the handler: not the job's failure.
        return HandBack(after_run=True, also="pool_timeouts",
                        why="no connection within the pool's timeout; handed back")
    return Fail(failure, count="timed_out" if isinstance(failure, HandlerTimedOut)
                else None)


async def retrying(call: Callable[[], Awaitable[T]], run: RunState, what: str) -> T:
    """Run a settlement, again after a failed connection (its reply may have been lost
    after the server committed: repeated under the same claim it answers what the first
    did, docs/design.md, "Settling twice"), within about 3.5 s and the run's hard
    deadline.

    Raises:
        What the last attempt raised; at once for anything but a connection failure.
    """
    for delay in (*_SETTLE_RETRY_DELAYS, None):
        try:
            return await call()
        except Exception as exc:
            if delay is None or not is_connection_failure(exc) or run.past_hard_deadline():
                raise
            log.warning("run %s: %s: %s; retrying", run.id, what,
                        first_line(exc, with_type=True))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


# -- carrying it out -----------------------------------------------------------------

class Settler:
    """Carries out settlements for one run: the only runner code that calls the queue's
    job transitions and writes the run's settling counters. Holds nothing of its own
    (the run's state is ``run``), so any part of the runner may make one.

    Args:
        queue: the :class:`rota.Queue` the jobs were claimed from.
        run: the run's state: its counters, the jobs it holds, its budget.
    """

    def __init__(self, queue: Queue, run: RunState) -> None:
        self.queue = queue
        self.run = run

    async def _complete(self, ctxs: Sequence[JobContext], results: Sequence[Any], *,
                        conn: AnyConn | None = None, many: bool = False) -> list[bool]:
        """The one place the runner completes jobs: ``many``, in one ``complete_many``
        (a group commit), else the one job with ``complete`` (``conn``: in the
        handler's transaction). Each job is charged its context's cost
        (:attr:`rota.JobContext.cost`; docs/design.md, "Cost")."""
        jobs = [c.job for c in ctxs]
        costs = [c.cost for c in ctxs]
        if many:
            return await self.queue.complete_many(jobs, results=list(results), costs=costs)
        return [await self.queue.complete(jobs[0], result=results[0], cost=costs[0],
                                          conn=conn)]

    def record(self, ctx: JobContext, outcome: Outcome) -> None:
        """The job left the run ``outcome``: it is no longer held, its span ends, and
        the run's counters say so (docs/design.md, "Counters show what committed")."""
        ctx.outcome = outcome
        run = self.run
        run.held.pop(ctx.job.id, None)
        if ctx.span is not None:
            tracing.end_process(ctx.span, outcome, run.out_of_time())
        if outcome == "done":
            run.jobs_done += 1
        elif outcome == "failed":
            run.jobs_failed += 1
        elif outcome == "deferred":
            run.jobs_deferred += 1
        elif outcome == "retry":
            run.add("retries")
        elif outcome == "released":
            run.add("released")
        else:
            run.add("lost")

    async def apply(self, settlement: Settlement, ctxs: list[JobContext], *,
                    complete: Callable[[list[tuple[JobContext, Complete]]], None],
                    blocked: list[QuotaExhausted], stage: Stage) -> None:
        """Carry out ``settlement`` (from :func:`decide`) for a handler call's jobs
        that are still unsettled.

        Args:
            complete: hands jobs ready to complete to the group commit
                (:class:`~rota.runner.completer.Completer`).
            blocked: takes a shared quota that ran out (the stage is skipped).
            stage: the call's stage (its rate limits).

        Raises:
            What the transitions raised once retries were spent (not for a
            best-effort :class:`HandBack`).
        """
        ids = [c.job.id for c in ctxs]
        if isinstance(settlement, Keep):
            return
        if isinstance(settlement, Complete):
            complete([(c, settlement) for c in await self.ready(ctxs, settlement.value)])
        elif isinstance(settlement, Fail):
            todo = [c for c in ctxs if not c.settled]
            if settlement.warn:
                log.warning("job(s) %s: %s", [c.job.id for c in todo], settlement.error)
            elif isinstance(settlement.error, BaseException):
                log.info("job(s) %s raised %s", ids, error_text(settlement.error))
            if settlement.count is not None:
                self.run.add(settlement.count, len(todo))
            for c in todo:
                await self.fail(c, settlement.error, give_up=settlement.give_up)
        elif isinstance(settlement, Defer):
            if settlement.blocks is not None:
                blocked.append(settlement.blocks)
            n = 0
            for c in ctxs:
                if not c.settled:
                    await self.defer(c, settlement.until)
                    n += 1
            if settlement.count is not None:
                self.run.add(settlement.count, n)
        elif isinstance(settlement, WaitForRate):
            await self.defer_for_rate(stage, ctxs, settlement.limited)
        else:
            todo = [c for c in ctxs if not c.settled]
            if settlement.why:
                log.warning("job(s) %s: %s", [c.job.id for c in todo], settlement.why)
            if settlement.also is not None:
                self.run.add(settlement.also, len(todo))
            try:
                await self.hand_back(todo, after_run=settlement.after_run,
                                     counted=settlement.count)
            except Exception:
                if not settlement.best_effort:
                    raise
                # Left held: the batch's end fails them, as a cut.
                log.exception("run %s: could not hand back jobs cut by its end",
                              self.run.id)

    async def ready(self, ctxs: list[JobContext], value: object) -> list[JobContext]:
        """The jobs of a handler call that returned normally, ready to complete: a
        one-job handler's return value becomes its job's result (a batch handler sets
        ``ctx.result`` itself), each checked and encoded now, so the batch that
        completes them cannot fail on one. A job whose value cannot be stored fails
        (given up: the value would not fit on a retry either) with the error saying why
        (docs/design.md, "Results")."""
        if len(ctxs) == 1 and value is not None:
            ctxs[0].result = value
        out = []
        for ctx in ctxs:
            if ctx.settled:
                continue
            if ctx.result is not None:
                try:
                    ctx.result = encode_result(ctx.result, self.queue.max_payload_bytes)
                except ResultError as exc:
                    log.info("job %s: %s", ctx.job.id, exc)
                    await self.fail(ctx, exc, give_up=True)
                    continue
            out.append(ctx)
        return out

    async def complete(self, ctx: JobContext, *, result: Any = None,
                       conn: AnyConn | None = None) -> bool:
        """Complete one job now with ``result`` (``ctx.complete``; the caller checked
        that it can be stored). With ``conn``, inside the handler's transaction: the
        job counts done only once the runner reads it done under this claim
        (:meth:`confirm_commits`).

        Returns:
            ``False`` when this run lost the job; with ``conn``, ``True`` means the
            statement matched in that transaction.
        """
        if conn is not None:
            [ok] = await self._complete([ctx], [result], conn=conn)
            if ok:
                ctx.in_caller_tx = True
            else:
                self.record(ctx, "lost")
            return ok
        [ok] = await retrying(lambda: self._complete([ctx], [result]),
                              self.run, "complete")
        self.record(ctx, "done" if ok else "lost")
        return ok

    async def complete_many(self, items: list[tuple[JobContext, Complete]]) -> None:
        """Complete jobs in one statement (a group commit), again across a dropped
        connection (docs/design.md, "Settling twice")."""
        ctxs = [c for c, _ in items]
        oks = await retrying(
            lambda: self._complete(ctxs, [c.result for c in ctxs], many=True),
            self.run, "complete")
        for (c, _), ok in zip(items, oks, strict=True):
            self.record(c, "done" if ok else "lost")

    async def fail(self, ctx: JobContext, error: BaseException | str, *,
                   give_up: bool = False) -> FailOutcome:
        """Record a failed attempt of one job (see :meth:`rota.Queue.fail`).

        Returns:
            ``"retry"``, ``"failed"`` or ``"lost"``.
        """
        tracing.record_failure(ctx.span, error)
        outcome = await retrying(
            lambda: self.queue.fail(ctx.job, error, give_up=give_up), self.run, "fail")
        self.record(ctx, outcome)
        return outcome

    async def defer(self, ctx: JobContext,
                    until: datetime | timedelta | None = None) -> bool:
        """Defer one job (see :meth:`rota.JobContext.defer`): a due time before the
        run's budget ends becomes that end, and is due as asked again when the run ends
        sooner (docs/design.md, "Defer").

        Returns:
            ``False`` when this run lost the job, or it gave up on its deferral cap.

        Raises:
            NaiveDatetimeError, InvalidInput: ``until`` is not a valid due time.
        """
        checked = due_or_delay(until, "until")
        run = self.run
        left = run.time_left()
        # The queue's clock, read once: for a delay, and for the end of the budget.
        now = (await self.queue.now()
               if isinstance(checked, timedelta) or left > 0 else None)
        asked: datetime | None
        if isinstance(checked, timedelta):
            assert now is not None
            asked = now + checked
        else:
            asked = checked
        when = _after_this_run(asked, now, left)
        ok = await retrying(lambda: self.queue.defer(ctx.job, when), run, "defer") == 1
        if ok:
            if when is not None and when != asked:
                run.pushed.append((ctx.job.id, ctx.job.claim_token, when, asked))
            self.record(ctx, "deferred")
        else:
            states = await retrying(lambda: self.queue.claim_states([ctx.job]), run,
                                    "defer")
            self.record(ctx, "failed" if states.get(ctx.job.id) == "failed" else "lost")
        return ok

    async def defer_for_rate(self, stage: Stage, ctxs: list[JobContext],
                             exc: RateLimited, lim: RateLimit | None = None) -> int:
        """Defer jobs whose rate-limit units are not there to ``exc.free_at`` (no
        attempt burned, a deferral counted: docs/design.md, "Defer"), note them as
        waiting for the limit, and, for an unkeyed limit of the stage, mark the stage
        waiting in this run. Unlike :meth:`defer`, the time is not pushed past the
        run's budget: the units are there at ``free_at``, so this run may run the job
        then.

        Returns:
            How many were deferred.
        """
        queue, run = self.queue, self.run
        todo = [c for c in ctxs if not c.settled]
        if not todo:
            return 0
        jobs = [c.job for c in todo]
        n = await retrying(lambda: queue.defer(jobs, exc.free_at), run, "defer")
        states: dict[int, str] | None = None
        if n < len(jobs):  # some gave up (max_deferrals) or were lost: ask which
            states = await retrying(lambda: queue.claim_states(jobs), run, "defer")
        deferred = []
        for c in todo:
            state = "pending" if states is None else states.get(c.job.id, "lost")
            if state == "pending":
                self.record(c, "deferred")
                deferred.append(c.job.id)
            else:
                self.record(c, "failed" if state == "failed" else "lost")
        if deferred:
            await note_rate_waits(queue, deferred, exc)
        run.add("rate_deferred", len(deferred))
        run.add(f"rate.{exc.limit}.deferred", len(deferred))
        again = [(c.job.id, c.job.deferrals + 1) for c in todo
                 if c.job.id in deferred and c.job.deferrals + 1 >= REPEATED_DEFERRALS]
        if again:
            # Deferred for a rate again and again: the units never reach this job (a
            # limit too small for the stage's traffic, a key every job shares, another
            # stage spending them first). Said, counted and shown in the run's summary
            # (docs/design.md, "Rates").
            run.add(f"rate.{exc.limit}.repeated", len(again))
            log.warning("stage %r: job(s) %s deferred for rate limit %r again "
                        "(deferrals: %s); its units keep going elsewhere: check the "
                        "limit's size and who takes it (rota limits)", stage.type,
                        [i for i, _ in again], exc.limit, [n for _, n in again])
        if exc.key == NO_KEY and (lim is None or lim in stage.limits):
            limit = lim or next((x for x in stage.limits if x.name == exc.limit), None)
            if limit is not None:
                now = await queue.now()
                wait_until(run, stage, exc.free_at - limit.max_wait, exc.free_at, now)
        log.debug("job(s) %s wait for rate limit %r until %s", deferred, exc.limit,
                  exc.free_at.isoformat())
        return n

    async def hand_back(self, ctxs: list[JobContext], *, after_run: bool = False,
                        counted: str = "released") -> None:
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
        run = self.run
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

    async def release(self, jobs: list[Job], counted: str | None = None) -> int:
        """Hand back claimed jobs no handler has seen (a prefetched batch, a batch the
        run ends before starting), counted under ``counted`` when given.

        Returns:
            How many were handed back (the others were reclaimed meanwhile).
        """
        n = await self.queue.release(jobs)
        if counted is not None:
            self.run.add(counted, n)
        return n

    async def confirm_commits(self, ctxs: list[JobContext],
                              failure: Exception | None) -> None:
        """Settle the jobs a handler completed in its own transaction by what the
        database says now: done under this claim (it committed), still running under it
        (it did not: the job fails with the handler's error and its backoff), or lost
        (docs/design.md, "Counters show what committed")."""
        waiting = [c for c in ctxs if c.in_caller_tx]
        if not waiting:
            return
        jobs = [c.job for c in waiting]
        states = await retrying(lambda: self.queue.claim_states(jobs), self.run,
                                "confirm")
        for c in waiting:
            c.in_caller_tx = False
            state = states.get(c.job.id)
            if state == "done":
                self.record(c, "done")
            elif state == "running":
                reason: Exception | str = (
                    failure if failure is not None
                    else "the transaction that completed the job did not commit")
                log.info("job %s: completed in a transaction that did not commit: %s",
                         c.job.id, reason)
                await self.fail(c, reason)
            else:
                self.record(c, "lost")

    async def leftovers(self, ctxs: list[JobContext]) -> None:
        """Hand back what a batch still holds: jobs never started go back as they were
        (attempts and deferrals unchanged: docs/design.md, "Defer"); when the stage's
        quota is gone, the skip that follows moves them to its reset. Jobs started but
        unsettled (the run is ending in error or cancelled) are failed, so they are
        retried after backoff rather than waiting for the stale window; when the run
        was asked to stop (cancelled by a second signal), they are handed back too,
        their attempt returned: an operator's stop is not the job's failure
        (docs/design.md, "The runner"). Logs instead of raising."""
        run = self.run
        if run.stopping():
            cut = [c for c in ctxs if not c.settled and c.started and not c.in_caller_tx
                   and not c.abandoned]
            if cut:
                try:
                    await self.hand_back(cut, counted="interrupted")
                except Exception:
                    log.exception("run %s: could not hand back interrupted jobs", run.id)
        unstarted = [c for c in ctxs if not c.settled and not c.started]
        if unstarted:
            try:
                await self.hand_back(unstarted)
            except Exception:
                log.exception("run %s: could not hand back unstarted jobs", run.id)
        for c in ctxs:
            # A job whose thread still runs (a hard stop left it behind at the platform
            # timeout) stays as it is, to the stale-lock rules (docs/design.md,
            # "Handler deadlines").
            if not c.settled and not c.in_caller_tx and not c.abandoned:
                try:
                    await self.fail(c, "the run stopped while the job was running")
                except Exception:
                    log.exception("run %s: could not release job %s", run.id, c.job.id)

    async def cut_off(self, held: list[JobContext]) -> None:
        """Settle what a run loop left behind when it would not stop at its hard
        deadline: jobs whose handler did not stop when cancelled fail (retried with
        backoff, counted ``timed_out``), jobs never started go back as they were. Logs
        nothing and raises nothing: the run is ending in error."""
        unstarted = [c for c in held if not c.started]
        if unstarted:
            try:
                await self.hand_back(unstarted)
            except Exception:
                pass
        for c in held:
            if c.started and not c.settled:
                try:
                    self.run.add("timed_out")
                    await self.fail(c, "timed out: the handler did not stop when "
                                       "cancelled at the run's hard deadline")
                except Exception:
                    pass

    def unreadable(self, n: int) -> None:
        """``n`` claimed rows could not be read: the claim gave them up, so they count
        failed (docs/design.md, "Bad data belongs to its job")."""
        self.run.jobs_failed += n
        self.run.add("unreadable", n)

    async def postpone(self, job_type: str, until: datetime, counted: str, *,
                       count_none: bool = False) -> int:
        """Move ``job_type``'s pending jobs (and its stale running ones) to ``until``
        (:meth:`rota.Queue.postpone`), counted under ``counted`` when any moved
        (``count_none``: even when none did).

        Returns:
            How many were moved.
        """
        n = await self.queue.postpone(job_type, until)
        if n > 0 or count_none:
            self.run.add(counted, n)
        return n

    async def restore_due_times(self) -> None:
        """The run has ended: the jobs whose due time it pushed to its budget's end are
        due as asked again, so a worker's next run takes them on time (docs/design.md,
        "Defer"). When the database cannot say so, they stay due at the budget's end:
        late, never lost."""
        run = self.run
        if not run.pushed:
            return
        try:
            await self.queue.restore_due_times(run.pushed)
        except Exception as exc:
            log.warning("run %s: %d job(s) stay due at the end of its budget: %s",
                        run.id, len(run.pushed), error_text(exc))


def _after_this_run(until: datetime | None, now: datetime | None,
                    left: float) -> datetime | None:
    # A run never runs a job it deferred: a job deferred to a time before the budget
    # ends is due when it ends, or it would be claimed again at once, and again.
    if left <= 0 or now is None:
        return until  # no more claims in this run
    floor = now + timedelta(seconds=left)
    return floor if until is None or until < floor else until


def wait_until(run: RunState, stage: Stage, look_at: datetime, free_at: datetime,
               now: datetime) -> None:
    """Mark ``stage`` waiting for its rate limits' units until ``look_at`` (the queue's
    clock) in this run (docs/design.md, "Rates")."""
    mono = time.monotonic() + max((look_at - now).total_seconds(), 0.0)
    old = run.rate_waits.get(stage.type)
    if old is None or old[0] < mono:
        run.rate_waits[stage.type] = (mono, free_at)


__all__ = ["CallOutcome", "Complete", "Defer", "Fail", "HandBack", "Keep",
           "Settlement", "Settler", "WaitForRate", "decide", "retrying"]
